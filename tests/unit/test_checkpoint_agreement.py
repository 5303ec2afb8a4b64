"""Checks that every process of a job resumes from the same checkpoint and that `save_on_each_node` stays on one
machine (`hf_seqrl.trainers.services.checkpoints`), on hand-made lists of what each process found."""

from __future__ import annotations

import pytest

from hf_seqrl.trainers.services.checkpoints import check_same_checkpoint, check_save_on_each_node


def test_processes_that_found_the_same_checkpoint_pass():
    check_same_checkpoint(["checkpoint-2", "checkpoint-2", "checkpoint-2"], "out")
    check_same_checkpoint([None, None], "out")  # none anywhere: the caller's own error follows, on every process
    check_same_checkpoint(["checkpoint-2"], "out")


def test_processes_that_found_different_checkpoints_are_named_with_the_fix():
    # machine 0 (processes 0, 1) wrote checkpoint-4; machine 1 (processes 2, 3) holds an older one, or none
    with pytest.raises(ValueError, match=r"checkpoint-4 on process\(es\) \[0, 1\]; checkpoint-2 on "
                                         r"process\(es\) \[2\]; none on process\(es\) \[3\]\): the machines do not "
                                         r"share out\. Put output_dir on storage every machine shares"):
        check_same_checkpoint(["checkpoint-4", "checkpoint-4", "checkpoint-2", None], "out")


def test_save_on_each_node_is_refused_on_several_machines_only():
    check_save_on_each_node([True, True, True, True])  # one machine of 4 processes
    with pytest.raises(ValueError, match="save_on_each_node=True on a job of several machines: .* Leave "
                                         "save_on_each_node off"):
        check_save_on_each_node([True, True, False, False])  # processes 2 and 3 on a second machine
