"""The layout of --model_dir (cluster/model_dir.py): each file a run shares there is written where the layout
names it and read back from there, and no other module spells a path under model_dir."""

import pathlib
import re

import numpy as np
import pytest

from ps_trainer.cluster import model_dir as layout
from ps_trainer.cluster import shutdown
from ps_trainer.input import work_queue
from tests.support import ROOT, read_flags
from ps_trainer.training import checkpoints, chief_claim, exit_codes, incremental, queue_hook, run_record


@pytest.mark.pure
def test_each_shared_file_is_written_where_the_layout_names_it_and_read_back_from_there(tmp_path):
    model_dir = str(tmp_path)
    cfg = read_flags("--ps_hosts=127.0.0.1:2222", "--worker_hosts=127.0.0.1:2223", "--job_name=worker",
                     "--task_index=0", f"--model_dir={model_dir}", "--train_steps=300")
    run_record.write(cfg)
    assert run_record.read(model_dir)["train_steps"] == 300

    claim = chief_claim.claim(model_dir, "10.0.0.1:2223", "worker:0", probe=lambda address: True)
    with pytest.raises(exit_codes.Failure, match="is in use"):  # a second chief reads the claim from the same file
        chief_claim.claim(model_dir, "10.0.0.2:2223", "worker:0", probe=lambda address: True, host="elsewhere")

    shutdown.mark_done(model_dir, 1, global_step=300, train_steps=300)
    assert shutdown.finished_step(model_dir, 1, train_steps=300) == 300
    shutdown.join(model_dir, 2, "127.0.0.1:2230")
    assert shutdown.joined(model_dir) == {2: "127.0.0.1:2230"}

    files = [["train-0.csv", 10]]
    work_queue.record_files(layout.queue_files(model_dir), files)
    assert "train-0.csv is gone" in work_queue.files_refusal(layout.queue_files(model_dir), [], True, "/data")

    audit = pathlib.Path(layout.audit_file(model_dir, "worker_0"))
    audit.parent.mkdir(parents=True)
    np.array([[0, 1, 2]], "<i8").tofile(audit)
    np.testing.assert_array_equal(queue_hook.read_audit(str(audit)), [[0, 1, 2]])

    written = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*") if path.is_file())
    named = [layout.run_record(model_dir), layout.chief_claim(model_dir), layout.done_mark(model_dir, 1),
             layout.member(model_dir, 2), layout.queue_files(model_dir), str(audit)]
    assert written == sorted(str(pathlib.Path(path).relative_to(tmp_path)) for path in named)
    claim.release()
    assert not pathlib.Path(layout.chief_claim(model_dir)).exists()


@pytest.mark.pure
def test_the_checkpoint_names_the_layout_gives_are_those_the_checkpoint_readers_match():
    prefix = f"{layout.CHECKPOINT_PREFIX}-200"
    for name in (f"{prefix}.index", f"{prefix}.data-00000-of-00002", f"{prefix}.meta", f"{prefix}_temp/part-0"):
        assert checkpoints.CHECKPOINT_FILE.match(name).group(1) == prefix
    assert checkpoints.STATE_TEMP_FILE.match(f"{layout.CHECKPOINT_STATE}.tmp1a2b")
    delta = incremental.DELTA_FILE.match(f"{incremental.delta_prefix(prefix, 250)}.index")
    assert delta.groups()[:2] == (prefix, "250")
    assert [layout.replica_of(name) for name in ("replica-3", "replica-3.tmp", "other")] == [3, None, None]
    assert layout.eval_dir("m", "holdout") == "m/eval_holdout" and layout.export_dir("m", 200) == "m/export/200"


PACKAGES = ("cluster", "flags", "input", "launch", "model", "ps_trainer", "scripts", "training")


@pytest.mark.pure
def test_no_other_module_spells_a_path_under_model_dir():
    joined = re.compile(r"os\.path\.join\([^()]*model_dir[^(),]*,\s*f?[\"']")
    names = [f'"{name}"' for name in (layout.RUN_RECORD, layout.CHIEF_CLAIM, layout.QUEUE_FILES, layout.AUDIT,
                                      layout.PLOT)]
    spelled = []
    code = [ROOT / "trainer.py", *(path for package in PACKAGES for path in (ROOT / package).glob("**/*.py"))]
    for path in sorted(code):
        relative = path.relative_to(ROOT)
        if path == ROOT / "cluster" / "model_dir.py":
            continue
        text = path.read_text()
        spelled += [f"{relative}: {match.group(0)}" for match in joined.finditer(text)]
        spelled += [f"{relative}: {name}" for name in names if name in text]
    assert not spelled, spelled
