"""Which conversations share a row: items of given lengths packed whole into rows of a fixed width.

    rows = pack_lengths([40, 70, 30, 90], width=129)   # [[3, 2], [1, 0]]: indices, longest first

Packing in the order given leaves a row's end empty whenever the next item
does not fit (a quarter of the tokens of conversations about half a row
long). Here each item, longest first, goes into the row it fills most
closely, and opens a new row only where none has room: rows come out
nearly full, so a step trains on more conversations for the same work.
"""


def pack_lengths(lengths, width):
    """Rows of at most `width` for items of `lengths` (each cut to `width`): a list of rows, each a list of the
    items' indices, longest first (ties in the order given). The same lengths give the same rows."""
    cut = [min(length, width) for length in lengths]
    rows = []
    # open_rows[room]: the rows with exactly `room` places left; the last one listed is filled first.
    open_rows = [[] for _ in range(width + 1)]
    for index in sorted(range(len(cut)), key=lambda index: -cut[index]):
        length = cut[index]
        room = next((room for room in range(length, width + 1) if open_rows[room]), None)
        if room is None:
            row, room = len(rows), width
            rows.append([])
        else:
            row = open_rows[room].pop()
        rows[row].append(index)
        if room - length > 0:
            open_rows[room - length].append(row)
    return rows
