import csv
import math

import pytest

from gptlite.training import history

pytestmark = pytest.mark.once("the history file is plain Python")


def test_history_keeps_every_column_and_leaves_older_rows_cells_empty(tmp_path):
    # A run resumed from an older checkpoint: its first row lacks the columns added since.
    rows = [dict(step=10, train_loss=2.0, val_loss=2.1, elapsed_s=1.0),
            dict(step=20, train_loss=1.5, val_loss=1.6, val_bits_per_char=2.3, tokens_per_s=900.0, elapsed_s=2.0)]
    history.write_history(rows, tmp_path / "history.csv")
    with open(tmp_path / "history.csv") as file:
        reader = csv.DictReader(file)
        written = list(reader)
    assert reader.fieldnames == ["step", "train_loss", "val_loss", "elapsed_s", "val_bits_per_char", "tokens_per_s"]
    assert written[0]["val_bits_per_char"] == "" and float(written[1]["val_bits_per_char"]) == 2.3


def test_throughput_leaves_out_the_first_batch_a_process_trains():
    throughput = history.Throughput(tokens_per_batch=100)
    # 5 batches from 0 s to 6 s, the first (the compile) ending at 2 s: 4 batches in 4 s.
    throughput.add(5, started=0.0, first_call_ended=2.0, ended=6.0)
    assert throughput.take() == pytest.approx(100.0)
    # Later fit calls count whole: 3 batches in 1 s.
    throughput.add(3, started=10.0, first_call_ended=10.4, ended=11.0)
    assert throughput.take() == pytest.approx(300.0)
    assert math.isnan(throughput.take())  # nothing trained since the last reading


def test_throughput_leaves_out_the_whole_first_call_where_a_call_runs_several_batches():
    throughput = history.Throughput(tokens_per_batch=100)
    # 25 batches in calls of 5 from 0 s to 6 s, the first call (the compile) ending at 2 s: 20 batches in 4 s.
    throughput.add(25, started=0.0, first_call_ended=2.0, ended=6.0, first_call_batches=5)
    assert throughput.take() == pytest.approx(500.0)
