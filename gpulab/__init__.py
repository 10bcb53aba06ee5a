"""gpulab: the helper library of the course "GPU Computing & Distributed Training".

Import it first in every notebook: it decides the runner (cpu or gpu) and, on the cpu runner,
turns on Numba's CUDA simulator before numba.cuda is loaded.

    import gpulab
    gpulab.runner            # Runner(name='cpu', ...): sizes, device, backend, precision recipe
    gpulab.show_source(fn)   # read the library's code from a lesson
    gpulab.progress("lab1")  # which parts of a lab pass their visible tests, and why not
    gpulab.hint("lab1", "transpose")   # the next hint for a part, one level per call
"""

from gpulab import compat, env, simulator_fix
from gpulab.source import show_source

__version__ = "0.1.0"

compat.install()  # before numba.cuda is imported anywhere

# Decided once, for the life of the process (see gpulab/env.py).
runner = env.detect()
env.switch_simulator(runner)
if runner.simulator:
    simulator_fix.install()  # closes a race in the simulator's shared memory


def __getattr__(name: str):
    # Imported on first use: `import gpulab` stays quick and loads neither torch nor numba.cuda.
    if name == "progress":
        from gpulab.self_check import progress

        return progress
    if name == "hint":
        from gpulab.self_check.hints import hint

        return hint
    raise AttributeError(f"module 'gpulab' has no attribute {name!r}")


__all__ = ["env", "hint", "progress", "runner", "show_source", "__version__"]
