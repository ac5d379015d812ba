"""The shared-storage encoder-cache janitor (`epdctl janitor`), a sidecar beside each encoder.

vLLM's `ECExampleConnector` (the `SharedStorage` EC connector) writes one embedding per multimodal
item to `<path>/<mm_hash>/encoder_cache.safetensors` and never deletes anything; a consumer that
merely *checks* for an item creates `<path>/<mm_hash>/` even on a miss. Left alone the volume fills up.

Semantics
---------
- An **entry** is a `<mm_hash>` directory directly under `--path` (names starting with `.` and
  `lost+found` are not entries). Its **age** is measured from its newest mtime: the directory's own
  and that of everything inside it. Its **size** is the sum of its files' sizes.
- `--ttl-seconds` is a **guaranteed minimum lifetime**: no entry younger than the TTL is ever deleted.
  The router reuses what an encoder reported about an item only within a TTL safely below this one,
  so it never points a consumer at a file the janitor may already have removed.
- Without `--max-size`, every entry older than the TTL is deleted.
- With `--max-size`, entries are kept while the store is within the bound; when it is over, entries
  older than the TTL are deleted oldest first until it fits. If it still does not fit (what remains
  is younger than the TTL) the sweep logs a warning and counts it in
  `epd_cache_janitor_over_limit_sweeps_total`; nothing young is touched.
- Empty or partial entries (no `encoder_cache.safetensors`: a consumer's cache miss, a crashed
  write, a janitor interrupted mid-delete) older than the TTL are deleted in both modes.
- Deleting an entry takes two steps: its files go when it is chosen; its directory, now empty (and
  young again, since removing a file touches it), goes as an empty entry once a TTL has passed.
  The size bound counts file bytes, so the first step is what frees space.

Concurrency
-----------
Several encoder pods share one ReadWriteMany volume and each runs a janitor, while vLLM keeps
writing. vLLM 0.32 writes the file in place with `safetensors.torch.save_file` (create+truncate at
the final name, no temporary file, no lock), and every write advances the file's mtime, so a file
being written is always younger than the TTL. To close the gap between checking a file and removing
it, a file is first *renamed* to `<name>.janitor-deleting.<token>` in its directory, then its mtime
is checked again on the renamed inode: a writer that opened it before the rename has truncated it
by then (that sets the mtime), so the file is put back instead of deleted. vLLM runs
`os.makedirs(<path>/<mm_hash>, exist_ok=True)` and then creates the file; removing the directory
between the two would fail that write (ENOENT in the encoder). Hence the two steps above: a
directory is only removed after it has stood empty for a TTL, and with `rmdir`, which fails
harmlessly if a writer created a file meanwhile. What remains is a window of microseconds, at
the moment an entry that has been empty for a whole TTL is re-encoded. Anything that vanishes
under a janitor (another janitor got there first) is skipped. Leftover renamed files from an
interrupted janitor keep their old mtime and are collected by a later sweep. Clocks of the nodes
writing and sweeping must agree to well within the TTL (mtimes are set by the writer's side).
Several janitors may each delete some of the oldest entries in the same round; with `--max-size`
that can free a little more than strictly needed, never anything younger than the TTL.

Each sweep logs one line (entries, bytes, what it deleted). `--metrics-port` serves Prometheus
metrics. SIGTERM or SIGINT ends the loop after the current sweep; the exit status is 0.
"""

from __future__ import annotations

from .deletion import TRASH_MARK, delete_entry
from .entries import CACHE_FILE, Entry, Plan, Policy, plan, scan
from .sidecar import Metrics, StopRequest, SweepResult, build_parser, main, run_once, sweep

__all__ = [
    "CACHE_FILE",
    "TRASH_MARK",
    "Entry",
    "Metrics",
    "Plan",
    "Policy",
    "StopRequest",
    "SweepResult",
    "build_parser",
    "delete_entry",
    "main",
    "plan",
    "run_once",
    "scan",
    "sweep",
]
