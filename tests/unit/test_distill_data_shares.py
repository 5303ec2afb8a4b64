"""How `hf-seqrl distill-data` shares the rows among the processes of a job (`hf_seqrl.cli.distill_data`)."""

from __future__ import annotations

from hf_seqrl.cli.distill_data import process_part, process_rows


def test_rows_go_in_contiguous_blocks_the_first_processes_one_more():
    rows = list(range(7))
    assert [rows[process_rows(7, i, 2)] for i in range(2)] == [[0, 1, 2, 3], [4, 5, 6]]
    # 10 rows on 4 processes: 10 = 4 * 2 + 2, so processes 0 and 1 take 3 rows, processes 2 and 3 take 2
    assert [list(range(10))[process_rows(10, i, 4)] for i in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [rows[process_rows(1, i, 3)] for i in range(3)] == [[0], [], []]  # fewer rows than processes


def test_each_process_writes_its_own_part_beside_the_output():
    assert process_part("out/teacher.jsonl", 0, 2) == "out/teacher.process-0-of-2.jsonl"
    assert process_part("out/teacher", 15, 16) == "out/teacher.process-15-of-16"
