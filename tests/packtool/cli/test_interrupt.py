"""What an interrupted `pack` says about the work it keeps (`interrupt.resume_note`)."""

from __future__ import annotations

from packtool.cli import interrupt
from packtool.engines import records
from packtool.engines.output_folder import STATE_DIR, staging_folder


def test_a_run_stopped_before_any_partition_finished_does_not_claim_finished_ones(tmp_path):
    # Seen: Ctrl-C while the worker pool started said "finished partitions are kept in ..."
    # where only the plan was (the note asked only whether the state folder existed).
    out = tmp_path / "out"
    staging = staging_folder(out)
    records.write_plan(staging, {"fingerprint": {}, "plan": {"partitions": [{}, {}]}})
    note = interrupt.resume_note(str(out), overwrite=False)
    assert "finished partitions" not in note
    assert note == (
        f"; no partition had finished (the run's plan is kept in {staging}): run the same "
        "command with --resume to finish"
    )


def test_a_run_with_a_finished_partition_says_so(tmp_path):
    out = tmp_path / "out"
    staging = staging_folder(out)
    records.write_plan(staging, {"fingerprint": {}, "plan": {"partitions": [{}, {}]}})
    records.write_record(staging, {"partition": 0, "shards": [], "counts": {}})
    assert interrupt.resume_note(str(out), overwrite=True) == (
        f"; finished partitions are kept in {staging}: run the same command with --resume "
        "instead of --overwrite to finish"
    )


def test_nothing_kept_says_nothing(tmp_path):
    assert interrupt.resume_note(str(tmp_path / "out"), overwrite=False) == ""
    (staging_folder(tmp_path / "out") / STATE_DIR).mkdir(parents=True)  # killed while planning
    assert "finished partitions" not in interrupt.resume_note(str(tmp_path / "out"), False)


def test_a_first_record_cut_off_while_written_is_no_finished_partition(tmp_path):
    # Seen: Ctrl-C during the first record's write left `parts/` holding only its temporary,
    # and the note said "finished partitions are kept" (it asked whether `parts/` existed).
    from packtool.storage import writing

    out = tmp_path / "out"
    staging = staging_folder(out)
    records.write_plan(staging, {"fingerprint": {}, "plan": {"partitions": [{}, {}]}})
    record = records.record_path(staging, 0)
    record.parent.mkdir(parents=True)
    writing.temporary_name(record).write_text('{"partition": 0')  # the write cut short
    assert records.finished(staging) == []
    note = interrupt.resume_note(str(out), overwrite=False)
    assert note.startswith("; no partition had finished (the run's plan is kept in ")
    records.write_record(staging, {"partition": 1, "shards": [], "counts": {}})
    assert interrupt.resume_note(str(out), False).startswith("; finished partitions are kept")
