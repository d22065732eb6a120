"""``python -m signoff``: the same as the ``signoff`` command."""

from signoff.runtime.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
