import numpy as np
import pytest

from gptlite.data.packing import pack_lengths

pytestmark = pytest.mark.once("packing is plain Python")


def test_items_in_an_order_that_wastes_rows_pack_into_full_ones():
    # In the order given, 80 then 80 cannot share a row of 140, and the last 60 would open a third.
    rows = pack_lengths([80, 80, 60, 60], 140)
    assert len(rows) == 2 and all(sorted(row) in ([0, 2], [0, 3], [1, 2], [1, 3]) for row in rows)
    assert pack_lengths([40, 70, 30, 90], 129) == [[3, 2], [1, 0]]


def test_every_item_goes_into_exactly_one_row_within_the_width_and_the_rows_repeat():
    lengths = [int(length) for length in np.random.default_rng(0).integers(1, 300, 2000)]  # some over the width
    rows = pack_lengths(lengths, 161)
    assert sorted(index for row in rows for index in row) == list(range(len(lengths)))
    assert all(sum(min(lengths[index], 161) for index in row) <= 161 for row in rows)
    assert all([min(lengths[index], 161) for index in row] == sorted((min(lengths[index], 161) for index in row),
                                                                     reverse=True) for row in rows)  # longest first
    assert rows == pack_lengths(lengths, 161)
    # No two rows could be one (each row after the first opened for an item no earlier row had room for).
    sizes = sorted(sum(min(lengths[index], 161) for index in row) for row in rows)
    assert sizes[0] + sizes[1] > 161


def test_nothing_packs_into_no_rows():
    assert pack_lengths([], 17) == []
