"""Real multi-process signoff for tests: :mod:`signoff.testing.cluster` (N ``signoff
gateway`` and M ``signoff worker`` processes on one Postgres database and one Redis, with
the offline demo model; they die with the test process)."""

from __future__ import annotations

from signoff.testing.cluster import SECRET, Cluster, Proc, cluster

__all__ = ["SECRET", "Cluster", "Proc", "cluster"]
