"""deltalake panics on an Arrow array whose offsets buffer is empty: a reproduction for an upstream
report (no Spark, no project code).

Seen with deltalake 1.6.6 (arrow-rs 59.3.0 inside), pyarrow 22.0.0 and 26, Python 3.11, Linux x86_64.

A variable-width array of length 0 may come with an offsets buffer of 0 bytes: Arrow Java writes
it so (Spark's `DataFrame.toArrow()` of a batch whose lists are all empty), and pyarrow's IPC
reader and `validate(full=True)` accept it. Exported through the C Data Interface, which carries no
buffer sizes, it points at pyarrow's shared zero-size area; arrow-rs reads the first offset from
there (pyarrow's debug pattern, -189,153,672) and panics when it copies the array, as a
partitioned write does:

    range start index 18446744073520397944 out of range for slice of length 0

Run: python docs/upstream/deltalake-empty-offsets.py   (exit 1 and the error: the fault is there;
exit 0: the installed versions no longer have it, and lib/delta/arrow.py's repair can go).
"""

import sys
import tempfile

import deltalake
import pyarrow as pa

# A list<string> column whose only list is empty: its string child has length 0 and no offsets.
child = pa.Array.from_buffers(pa.string(), 0, [None, pa.py_buffer(b""), pa.py_buffer(b"")])
table = pa.table({"day": ["2021-02-01"], "apps": pa.ListArray.from_arrays(pa.array([0, 0], pa.int32()), child)})
table.validate(full=True)
# Through Arrow's IPC, as Spark hands batches to Python: the empty buffer becomes the shared zero-size area.
sink = pa.BufferOutputStream()
with pa.ipc.new_stream(sink, table.schema) as writer:
    writer.write_table(table)
table = pa.ipc.open_stream(sink.getvalue()).read_all()
table.validate(full=True)

print(f"deltalake {deltalake.__version__}, pyarrow {pa.__version__}")
try:
    deltalake.write_deltalake(tempfile.mkdtemp(), table, mode="append", partition_by=["day"])
except Exception as error:  # noqa: BLE001 - the fault, reported
    print(f"write_deltalake failed: {error}")
    sys.exit(1)
print("write_deltalake succeeded")
