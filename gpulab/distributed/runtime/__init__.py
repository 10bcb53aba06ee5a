"""How ranks start, run, report and stop: the process machinery under gpulab.distributed.

    from gpulab.distributed import run_on_ranks, LocalCluster   # the faces, as lessons use them

The launch faces
launch.py          run_on_ranks / Launcher: a notebook-defined function on N processes
torchrun.py        torchrun_script: a script written from a cell, under torchrun; RunClock, the
                   start-up and run limits that LocalCluster shares
cluster.py         LocalCluster: N nodes x M processes on this machine, torchrun + c10d rendezvous
cluster_result.py  ClusterResult, NodeResult: what a cluster run left behind, and why it failed
netns.py           a network namespace per node, joined by a virtual switch, where allowed
node_script.py     script_of: a notebook's functions and classes written out as a script a node runs
errors.py          LaunchError: RankError, LaunchTimeout, ProcessGroupStartError, Preempted
notice.py          Notice: a preemption notice (signal, grace period, SIGKILL) for one node or
                   rank, triggered by a line of output; NoticeReport; REQUEUE_EXIT_CODE

The process helpers and the payload
processes.py       children that die with their parent, output forwarded by rank, stack dumps,
                   a stop that leaves nothing (standard library only: the node client uses it)
by_value.py        pickling that sends a notebook's functions and classes by value

Where a rank starts
bootstrap.py       every process of the runtime starts here: one command line, a role by name
worker.py          one rank of run_on_ranks (and StatusBoard: where a rank is, for its launcher)
torchrun_entry.py  one rank under torchrun: runs the script and reports as worker.py does; and
                   torchrun's agent, started so that it dies with its launcher
forking.py         the fork servers' core: the loop that forks and reports, a child's fresh start
forkserver.py      run_on_ranks' warm server: imports torch once, forks each gloo rank
nodeserver.py      a LocalCluster node's warm server: forks that node's agent and ranks
node_client.py     what torchrun runs per rank when its node has a server: asks the server to
                   fork the rank, and stands in for it

Taught in: lessons/04_distributed_fundamentals.ipynb (run_on_ranks) and
lessons/06_model_pipeline_tensor_parallelism.ipynb (LocalCluster, torchrun_script)
"""

from gpulab.faces import lazy_face, names_of

MODULES = {  # module -> the public names it gives this face
    "gpulab.distributed.runtime.launch": ("Launcher", "run_on_ranks"),
    "gpulab.distributed.runtime.torchrun": ("TorchrunResult", "torchrun_script"),
    "gpulab.distributed.runtime.cluster": ("LocalCluster",),
    "gpulab.distributed.runtime.cluster_result": ("ClusterResult", "NodeResult",
                                                  "START_FAILURE"),
    "gpulab.distributed.runtime.netns": ("InterfaceBytes", "NetnsError"),
    "gpulab.distributed.runtime.node_script": ("SourceNotFound", "script_of"),
    "gpulab.distributed.runtime.errors": ("LaunchError", "LaunchTimeout", "Preempted",
                                          "ProcessGroupStartError", "RankError"),
    "gpulab.distributed.runtime.notice": ("Notice", "NoticeReport", "REQUEUE_EXIT_CODE"),
}
__getattr__, __dir__ = lazy_face(__name__, MODULES)
__all__ = names_of(MODULES)
