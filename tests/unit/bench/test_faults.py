"""`make bench-faults`' report from recorded runs (no cluster): rows run alone (`--only`) replace theirs in
faults.json and the report shows every row once, in the table's order, with the run it comes from."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from bench import faults
from tests.support.fault_table import ALL_ROWS, METRIC_ROWS, ROWS, FaultRecord, Row, record_document


def run(names: tuple[str, ...], started: datetime, **more: str) -> dict:
    # each row's facts left out: the report says it did not complete (the facts' words are fault_checks' tests)
    rows = [
        Row(n, f"fault {n}", f"expected of {n}", 1.0, 2.0, 3.0, 5, recover_s=1.0, facts={"error": "x"}) for n in names
    ]
    record = FaultRecord(rows, [{"status": 200, "start": 1.0, "end": 1.5}], {"clients": 2, "replicas": {"decode": 1}})
    return record_document(record, started, time.monotonic(), commit="abc1234", **more)


OLD = datetime(2026, 12, 2, tzinfo=UTC)
NEW = datetime(2026, 12, 5, tzinfo=UTC)


def test_rows_run_alone_replace_theirs_and_keep_the_others():
    old = run(ROWS, OLD)  # a faults.json from before runs were kept apart: one run, no `runs`
    assert faults.runs_of(old) == [old]
    again = run(("kubelet_restarted", *METRIC_ROWS), NEW, cpu="AMD EPYC", machine="x86_64")
    runs = faults.merged(faults.runs_of(old), again)
    assert [[r["name"] for r in run["record"]["rows"]] for run in runs] == [
        list(ROWS[:-1]),
        ["kubelet_restarted", *METRIC_ROWS],
    ]
    # a run whose every row was run again is dropped
    assert faults.merged(runs, run(ROWS[:-1], NEW))[0]["record"]["rows"][0]["name"] == "kubelet_restarted"


def test_the_report_shows_every_row_once_in_the_tables_order_with_each_run():
    runs = faults.merged([run(ROWS, OLD)], run(("kubelet_restarted", *METRIC_ROWS), NEW, cpu="AMD EPYC"))
    text = faults.report(runs)
    table = [line for line in text.splitlines() if line.startswith("| fault ") and "| expectation |" not in line]
    assert len(table) == len(ALL_ROWS)
    assert [line.split(" | ")[0] for line in table] == [f"| fault {n}" for n in ALL_ROWS]
    [run_line] = [line for line in text.split("\n\n") if line.startswith("Run ")]
    assert run_line.startswith("Run 2026-12-02 00:00 UTC, commit `abc1234`, CPU not recorded")
    assert "8 rows" not in run_line and "Run 2026-12-05 00:00 UTC, commit `abc1234`, AMD EPYC" in run_line
    assert "the rows `kubelet_restarted`, `prometheus_lost`, `adapter_lost`" in run_line
    assert "All requests of run 2: 1, failed 0." in text
