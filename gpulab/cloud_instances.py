"""Cloud GPU instances: which GPUs each machine type carries, and what it costs per hour.

    get_instance("a3-highgpu-8g")                  # 8 x H100 SXM, Google Cloud
    get_instance("p4d.24xlarge").gpu_memory_gb     # 320.0: 8 x 40 GB
    instances_with("L4")                           # every machine type built on L4s

Each row names its GPU as gpulab.gpu_specs does, so a machine's GPU memory, bandwidth and
FLOP/s come from the spec sheet (`instance.spec`), never from a second copy here.

PRICES ARE ILLUSTRATIVE. `usd_per_hour` is an on-demand list price in a US region (Google
Cloud us-central1, AWS us-east-1, Azure East US), rounded, as listed around PRICES_AS_OF. Cloud
prices change, often by tens of percent at once (AWS cut its P4 and P5 on-demand prices by up to
45% in June 2025), and differ by region, commitment and negotiated discount. Use them to learn
the arithmetic; for a real budget take today's price from the provider's page and pass it to the
functions of gpulab.cloud_cost, which all take the price as a parameter.
Taught in: lessons/01_gpu_architecture.ipynb (where to get GPUs)
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab.gpu_specs import GPUSpec, get_gpu

PRICES_AS_OF = "2025-01"  # when usd_per_hour was read off the providers' pricing pages
PROVIDERS = ("Google Cloud", "AWS", "Azure")


@dataclass(frozen=True)
class CloudInstance:
    """One machine type of a cloud provider and the GPUs it comes with."""

    provider: str  # "Google Cloud", "AWS" or "Azure"
    name: str  # the provider's machine type, e.g. "a2-highgpu-8g", "p5.48xlarge"
    family: str  # the series it belongs to, as the provider's documentation groups them
    gpu: str  # the GPU's name in gpulab.gpu_specs
    n_gpus: int  # GPUs in one machine
    usd_per_hour: float  # ILLUSTRATIVE on-demand list price of the whole machine (PRICES_AS_OF)

    @property
    def spec(self) -> GPUSpec:
        """The spec-sheet row of the machine's GPU."""
        return get_gpu(self.gpu)

    @property
    def gpu_memory_gb(self) -> float:
        """GPU memory of the whole machine, GB (n_gpus x one GPU's)."""
        return self.n_gpus * self.spec.memory_gb

    @property
    def usd_per_gpu_hour(self) -> float:
        """The illustrative price per GPU-hour: what cloud_cost.run_cost_usd multiplies."""
        return self.usd_per_hour / self.n_gpus


# Machine types from each family the course meets; the 8-GPU machines are the training nodes.
INSTANCES: tuple[CloudInstance, ...] = (
    # Google Cloud: N1 machines take attached GPUs; A2, A3 and G2 come with theirs.
    CloudInstance("Google Cloud", "n1-standard-8 + 1 x T4", "N1 with attached GPUs", "T4", 1, 0.73),
    CloudInstance("Google Cloud", "g2-standard-8", "G2", "L4", 1, 0.85),
    CloudInstance("Google Cloud", "a2-highgpu-1g", "A2 High", "A100 40GB SXM", 1, 3.67),
    CloudInstance("Google Cloud", "a2-highgpu-8g", "A2 High", "A100 40GB SXM", 8, 29.39),
    CloudInstance("Google Cloud", "a2-ultragpu-8g", "A2 Ultra", "A100 80GB SXM", 8, 40.55),
    CloudInstance("Google Cloud", "a3-highgpu-8g", "A3 High", "H100 SXM", 8, 88.49),
    # AWS: G instances for inference and small training, P instances for training.
    CloudInstance("AWS", "g4dn.xlarge", "G4dn", "T4", 1, 0.526),
    CloudInstance("AWS", "g5.xlarge", "G5", "A10G", 1, 1.006),
    CloudInstance("AWS", "g6.xlarge", "G6", "L4", 1, 0.805),
    CloudInstance("AWS", "p4d.24xlarge", "P4d", "A100 40GB SXM", 8, 32.77),
    CloudInstance("AWS", "p5.48xlarge", "P5", "H100 SXM", 8, 98.32),
    # Azure: NC for single GPUs, ND for the InfiniBand-connected training nodes.
    CloudInstance("Azure", "NC4as_T4_v3", "NCasT4_v3", "T4", 1, 0.526),
    CloudInstance("Azure", "ND96asr_v4", "ND A100 v4", "A100 40GB SXM", 8, 27.20),
    CloudInstance("Azure", "ND96amsr_A100_v4", "NDm A100 v4", "A100 80GB SXM", 8, 32.77),
    CloudInstance("Azure", "ND96isr_H100_v5", "ND H100 v5", "H100 SXM", 8, 98.32),
)


def get_instance(name: str) -> CloudInstance:
    """The row of machine type `name` (case-insensitive). KeyError, listing the known ones."""
    for instance in INSTANCES:
        if instance.name.lower() == name.strip().lower():
            return instance
    raise KeyError(f"No machine type {name!r} in gpulab's table. Known: "
                   f"{', '.join(i.name for i in INSTANCES)}. For another one, build a "
                   "CloudInstance with its GPU's name in gpulab.gpu_specs and today's price.")


def instances_with(gpu: str) -> list[CloudInstance]:
    """Every machine type in the table whose GPU is `gpu` (any spelling get_gpu accepts)."""
    wanted = get_gpu(gpu).name
    return [i for i in INSTANCES if i.spec.name == wanted]
