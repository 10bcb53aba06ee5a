"""The class in a box: one JupyterHub for the course on this machine (`make hub`).

Everything here is the hub's own machinery, configured:
  - DummyAuthenticator lets in the fixed demo accounts of hub/roster.py, with one shared
    password (GPULAB_HUB_PASSWORD, default "gpulab"); the instructor is the hub's admin;
  - LocalProcessSpawner starts each user's JupyterLab as that user's own system account (the
    Makefile creates them), so learners cannot read one another's work and nbgrader's exchange
    knows who handed in what by the files' owner. That needs the hub to run as root;
  - every JupyterLab runs on the course's virtual environment (this interpreter), so the course
    is installed for every user;
  - learners get the learner's JupyterLab with nbgrader's Assignments tab (fetch, submit, fetch
    feedback) and Validate, without the instructor tools (hub/learner/); the instructor gets all
    of nbgrader's tools, with the formgrader on the grading root.

The hub's state lives in GPULAB_HUB_STATE (default .hub/ in the repository):
    exchange/       nbgrader's exchange, shared by everyone (`python -m autograder publish`...)
    course/         the grading root (`python -m autograder ... --course-dir .hub/course`)
    users/<user>/   each user's Jupyter state (runtime files, settings, nbgrader's cache of
                    what they handed in); their work is in their account's home, which their
                    JupyterLab serves (nbgrader fetches into its working folder, the home)
    jupyterhub.sqlite, jupyterhub_cookie_secret, proxy.pid    the hub's own
Ports: GPULAB_HUB_PORT (the address users open, default 8000), GPULAB_HUB_API_PORT (default 8081)
and GPULAB_HUB_PROXY_API_PORT (default 8001). The proxy (configurable-http-proxy, from npm) is
GPULAB_HUB_PROXY, as `make hub-tools` installed it.
"""

import os
import pwd
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from roster import INSTRUCTORS, LEARNERS  # noqa: E402 (the folder goes on the path first)

c = get_config()  # noqa: F821 (traitlets defines it when it runs this file)

STATE = Path(os.environ.get("GPULAB_HUB_STATE", HERE.parent / ".hub")).resolve()
EXCHANGE, COURSE, USERS = STATE / "exchange", STATE / "course", STATE / "users"
PORT = int(os.environ.get("GPULAB_HUB_PORT", "8000"))
# A cold JupyterLab importing nbgrader on a busy 2-core machine takes tens of seconds.
START_TIMEOUT_S = 180

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = PORT
c.JupyterHub.hub_port = int(os.environ.get("GPULAB_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = (
    f"http://127.0.0.1:{int(os.environ.get('GPULAB_HUB_PROXY_API_PORT', '8001'))}")
c.ConfigurableHTTPProxy.command = [os.environ.get("GPULAB_HUB_PROXY", "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")

c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = os.environ.get("GPULAB_HUB_PASSWORD", "gpulab")
c.Authenticator.allowed_users = set(INSTRUCTORS + LEARNERS)
c.Authenticator.admin_users = set(INSTRUCTORS)

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = START_TIMEOUT_S
c.Spawner.http_timeout = START_TIMEOUT_S


def role_config_path(spawner) -> str:
    """Where the user's JupyterLab reads its configuration first: hub/learner/ turns off the
    instructor tools for learners; hub/common/ points nbgrader at the exchange for everyone."""
    role = [] if spawner.user.name in INSTRUCTORS else [HERE / "learner"]
    return os.pathsep.join(str(path) for path in [*role, HERE / "common"])


def in_state(*parts: str):
    """An environment value: a folder of the user's Jupyter state, kept in the hub's state
    folder (a new hub starts with no cached submission of an old one)."""
    return lambda spawner: str(USERS.joinpath(spawner.user.name, *parts))


c.Spawner.environment = {
    # The course's interpreter first: `python -m autograder` in the instructor's terminal.
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    "JUPYTER_CONFIG_PATH": role_config_path,
    "JUPYTER_DATA_DIR": in_state("jupyter"),  # nbgrader's cache of submissions is in there
    "JUPYTER_RUNTIME_DIR": in_state("runtime"),
    "JUPYTERLAB_WORKSPACES_DIR": in_state("workspaces"),
    "JUPYTERLAB_SETTINGS_DIR": in_state("settings"),
    "IPYTHONDIR": in_state("ipython"),
    "MPLCONFIGDIR": in_state("matplotlib"),
    "GPULAB_EXCHANGE": str(EXCHANGE),
    "GPULAB_COURSE_DIR": lambda spawner: str(COURSE) if spawner.user.name in INSTRUCTORS else "",
}


def make_user_state(spawner) -> None:
    """The user's state folder, theirs alone; the exchange and the grading root, for everyone."""
    account = pwd.getpwnam(spawner.user.name)
    folder = USERS / spawner.user.name
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, account.pw_uid, account.pw_gid)
    folder.chmod(0o700)
    for shared, mode in ((EXCHANGE, 0o777), (COURSE, 0o755)):  # nbgrader wants 777
        shared.mkdir(parents=True, exist_ok=True)
        shared.chmod(mode)


c.Spawner.pre_spawn_hook = make_user_state
