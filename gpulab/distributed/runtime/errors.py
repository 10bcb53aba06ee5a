"""What can go wrong when a function runs on several ranks, each as an exception that says
which rank, where, and what to look at. Raised by gpulab.distributed.runtime.launch."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A launch of a function on ranks failed; the subclasses say how."""


class RankError(LaunchError):
    """A rank raised an exception (or died) while running the function.

    rank         the rank that failed first
    exc_type     the exception's class name, e.g. "ValueError" ("" when the process died)
    traceback    that rank's full traceback text (or its last output lines when it died)
    exception    the exception object itself, when it could be sent back, else None
    """

    def __init__(self, message: str, rank: int, exc_type: str = "", traceback: str = "",
                 exception: BaseException | None = None):
        super().__init__(message)
        self.rank, self.exc_type, self.traceback, self.exception = (rank, exc_type, traceback,
                                                                    exception)


class LaunchTimeout(LaunchError, TimeoutError):
    """Some ranks were still running when the time limit came: usually a hang in a collective.

    waiting   {rank: where it was, e.g. "all_reduce (called at cell.py:5)"}, running ranks only
    stacks    {rank: its Python stack when it was stopped}, where the stack could be captured
    """

    def __init__(self, message: str, waiting: dict[int, str], stacks: dict[int, str]):
        super().__init__(message)
        self.waiting, self.stacks = waiting, stacks


class ProcessGroupStartError(LaunchError):
    """The process group failed to start: a rendezvous or connection error before the function
    ran. The launcher retries such a launch once when no rank had started the function yet.

    rank           the rank that reported it first (None for a start-up time-out)
    user_code_ran  whether any rank had already started the function (then it is not retried)
    """

    def __init__(self, message: str, rank: int | None, user_code_ran: bool):
        super().__init__(message)
        self.rank, self.user_code_ran = rank, user_code_ran


class Preempted(LaunchError):
    """A rank was given notice (run_on_ranks' `notice`, see notice.py) and did not return:
    the launch ended because of the notice, whatever the other ranks did after it.

    report             the NoticeReport: the signal, when, and whether the rank exited within
                       the grace period or was killed
    exit_codes         {rank: code} for the ranks that exited (sys.exit(code), or died: a
                       negative code is the signal)
    values             {rank: return value} for the ranks that returned
    requeue_requested  the noticed rank stopped by itself with REQUEUE_EXIT_CODE
    """

    def __init__(self, message: str, report, exit_codes: dict[int, int | None],
                 values: dict[int, object]):
        super().__init__(message)
        self.report, self.exit_codes, self.values = report, exit_codes, values

    @property
    def requeue_requested(self) -> bool:
        return self.report.requeue_requested
