#!/usr/bin/env python3
"""dtrain_worker's TensorBoard event files, read back by a reader independent of dtrain's C++ code: this file
parses the TFRecord framing and checks both masked CRC-32Cs itself, and decodes tensorflow.Event / Summary /
HistogramProto with its own protobuf wire-format decoder, following TensorFlow's public schema
(tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto).

Runs (1) a local training run, (2) an async cluster of 2 ps tasks + 2 workers and (3) dlrm on synthetic
click-through-rate data on a sync cluster of 2 ps tasks + 2 workers, all with --logdir and --summary_every, and
checks that the learning rate (with its decay), the test accuracy, bytes per second per ps task, the staleness
histogram (async) and the weight and gradient histograms are there, at the right steps, with sane values and
TensorFlow's default bucket limits; and for dlrm every table's rows (summed over the ps tasks), rows created and
evicted per second, the unique ids per step, test AUC and log loss.

  tests/tensorboard_events_test.py [--bin build/bin]
"""
import argparse
import glob
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- CRC-32C (Castagnoli), as TFRecord uses it ----
def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    data = open(path, "rb").read()
    pos, records = 0, []
    while pos < len(data):
        if len(data) - pos < 12:
            raise AssertionError("%s: truncated record header at byte %d" % (path, pos))
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked_crc(header):
            raise AssertionError("%s: bad length CRC at byte %d" % (path, pos))
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            raise AssertionError("%s: truncated record at byte %d" % (path, pos))
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if body_crc != masked_crc(body):
            raise AssertionError("%s: bad data CRC at byte %d" % (path, pos))
        records.append(body)
        pos += 16 + length
    return records


# ---- protobuf wire format ----
def decode(buf):
    """field number -> list of (wire_type, value): ints for varint/fixed, bytes for length-delimited."""
    fields, pos = {}, 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise AssertionError("unexpected wire type %d" % wire)
        fields.setdefault(number, []).append((wire, value))
    return fields


def _varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def one(fields, number, wire):
    values = fields.get(number, [])
    assert len(values) == 1 and values[0][0] == wire, "field %d: %r" % (number, values)
    return values[0][1]


def f64(b):
    return struct.unpack("<d", b)[0]


def packed_f64(b):
    return list(struct.unpack("<%dd" % (len(b) // 8), b))


def read_events(logdir):
    """Returns (scalars, histograms): tag -> [(step, value)] and tag -> [(step, histo dict)]."""
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert len(files) == 1, "expected one event file in %s, found %r" % (logdir, files)
    records = read_records(files[0])
    first = decode(records[0])
    assert one(first, 3, 2) == b"brain.Event:2", "first event is not file_version brain.Event:2"
    scalars, histograms = {}, {}
    for r in records[1:]:
        event = decode(r)
        wall_time = f64(one(event, 1, 1))
        assert wall_time > 1.5e9, "wall_time %r" % wall_time
        step = one(event, 2, 0)
        summary = decode(one(event, 5, 2))
        for wire, value in summary[1]:
            v = decode(value)
            tag = one(v, 1, 2).decode()
            if 2 in v:  # simple_value
                scalars.setdefault(tag, []).append((step, struct.unpack("<f", one(v, 2, 5))[0]))
            else:  # histo: HistogramProto
                h = decode(one(v, 5, 2))
                histo = {name: f64(one(h, n, 1)) for n, name in
                         ((1, "min"), (2, "max"), (3, "num"), (4, "sum"), (5, "sum_squares"))}
                histo["bucket_limit"] = packed_f64(one(h, 6, 2))
                histo["bucket"] = packed_f64(one(h, 7, 2))
                histograms.setdefault(tag, []).append((step, histo))
    return scalars, histograms


def tf_default_limits():
    pos, v = [], 1.0e-12
    while v < 1.0e20:
        pos.append(v)
        v *= 1.1
    pos.append(sys.float_info.max)
    return [-x for x in reversed(pos)] + [0.0] + pos


class Checker:
    def __init__(self):
        self.failures = 0

    def check(self, ok, what):
        print(("ok: " if ok else "FAIL: ") + what)
        if not ok:
            self.failures += 1


def check_histogram(c, name, histo, expected_num, limits):
    c.check(histo["num"] == expected_num, "%s: num %g == %d" % (name, histo["num"], expected_num))
    c.check(sum(histo["bucket"]) == histo["num"], "%s: buckets add up to num" % name)
    c.check(histo["min"] <= histo["max"], "%s: min %g <= max %g" % (name, histo["min"], histo["max"]))
    mean = histo["sum"] / max(histo["num"], 1)
    c.check(histo["min"] - 1e-9 <= mean <= histo["max"] + 1e-9, "%s: mean within [min, max]" % name)
    c.check(histo["sum_squares"] >= 0 and math.isfinite(histo["sum_squares"]), "%s: sum_squares sane" % name)
    bl = histo["bucket_limit"]
    c.check(len(bl) == len(histo["bucket"]) and bl == sorted(bl) and all(x in limits for x in bl),
            "%s: %d bucket limits, ascending, all TensorFlow default limits" % (name, len(bl)))
    # Every value lies in a non-empty bucket: the bucket holding min ends above min.
    first = next(i for i, n in enumerate(histo["bucket"]) if n > 0)
    c.check(bl[first] > histo["min"] and (first == 0 or bl[first - 1] <= histo["min"] or histo["bucket"][first - 1] == 0),
            "%s: the first non-empty bucket holds min" % name)


def check_dlrm(c, bin_dir, work):
    data = os.path.join(work, "ctr")
    out = subprocess.run([os.path.join(bin_dir, "dtrain_convert"), "--synthetic_ctr", "--examples=5000",
                          "--test_examples=1000", "--out=" + data], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=120, text=True)
    c.check(out.returncode == 0, "dtrain_convert --synthetic_ctr exits 0")
    logdir = os.path.join(work, "dlrm")
    batch, max_rows = 64, 300
    cmd = [os.path.join(ROOT, "scripts", "run_local_cluster.sh"), "--ps", "2", "--workers", "2", "--logdir",
           os.path.join(work, "dlrm_logs"), "--", "--model=dlrm", "--data_dir=" + data, "--data_format=criteo",
           "--mode=sync", "--train_steps=60", "--batch_size=%d" % batch, "--max_rows=%d" % max_rows,
           "--log_every=20", "--summary_every=20", "--logdir=" + logdir]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, text=True,
                         env=dict(os.environ, DTRAIN_BIN=bin_dir))
    print(out.stdout[-1500:])
    c.check(out.returncode == 0, "dlrm cluster exits 0")
    scalars, _ = read_events(logdir)
    tables = ["embedding/C%d" % (f + 1) for f in range(26)]
    tags = ["sparse/%s/%s" % (t, what) for t in tables for what in ("rows", "rows_created_per_sec",
                                                                     "rows_evicted_per_sec")]
    bad = [tag for tag in tags if [s for s, _ in scalars.get(tag, [])] != [20, 40, 60] or
           any(x < 0 for _, x in scalars.get(tag, []))]
    c.check(not bad, "%d table scalars at steps 20, 40, 60, none negative%s" %
            (len(tags), "; not: %s" % ", ".join(bad[:5]) if bad else ""))
    # C1 has 10 ids, spread over the two tasks: the sum holds each once. C26 (a million ids) fills both tasks.
    c1 = [x for _, x in scalars.get("sparse/embedding/C1/rows", [])]
    c.check(c1 and all(x == 10 for x in c1), "C1's 10 rows summed over both ps tasks: %r" % c1)
    c26 = [x for _, x in scalars.get("sparse/embedding/C26/rows", [])]
    c.check(c26 and all(max_rows < x <= 2 * max_rows for x in c26),
            "C26 held by both tasks, at most %d rows each: %r" % (max_rows, c26))
    created = [x for _, x in scalars.get("sparse/embedding/C1/rows_created_per_sec", [])]
    c.check(len(created) == 3 and created[0] > 0 and created[1:] == [0, 0],
            "C1's rows are created in the first summary period only: %r" % created)
    evicted = [x for _, x in scalars.get("sparse/embedding/C26/rows_evicted_per_sec", [])]
    c.check(len(evicted) == 3 and all(x > 0 for x in evicted[1:]), "C26 evicts beyond max_rows: %r" % evicted)
    unique = [x for _, x in scalars.get("sparse/unique_ids_per_step", [])]
    c.check(len(unique) == 3 and all(26 < x <= 26 * batch for x in unique),
            "unique ids per step in (26, 26 x batch]: %r" % unique)
    auc = scalars.get("test_auc", [])
    c.check(len(auc) == 1 and 0.5 < auc[0][1] <= 1, "test_auc at the end: %r" % auc)
    c.check(len(scalars.get("test_log_loss", [])) == 1, "test_log_loss at the end")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("DTRAIN_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="dtrain_events_test.")
    c = Checker()
    limits = set(tf_default_limits())
    try:
        # 1. Local: learning-rate decay, accuracy, histograms of every variable every 40 steps.
        logdir = os.path.join(work, "local")
        cmd = [os.path.join(a.bin, "dtrain_worker"), "--job_name=local", "--model=mlp", "--train_steps=120",
               "--log_every=40", "--eval_every=60", "--learning_rate=0.2", "--decay_steps=50", "--decay_rate=0.5",
               "--staircase", "--summary_every=40", "--logdir=" + logdir]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, text=True)
        print(out.stdout[-1500:])
        c.check(out.returncode == 0, "local run exits 0")
        scalars, histos = read_events(logdir)
        lr = dict(scalars.get("learning_rate", []))
        c.check(sorted(lr) == [40, 80, 120], "learning_rate at steps 40, 80, 120: %r" % sorted(lr))
        for step, value in lr.items():
            want = 0.2 * 0.5 ** (step // 50)
            c.check(abs(value - want) < 1e-6, "learning_rate at %d = %g (want %g)" % (step, value, want))
        acc = scalars.get("test_accuracy", [])
        c.check(len(acc) == 2 and all(0.5 < v <= 1 for _, v in acc), "test_accuracy at 60 and the end: %r" % acc)
        c.check(len(scalars.get("loss", [])) == 3, "three loss scalars")
        rates = scalars.get("ps/task_0/received_bytes_per_sec", [])
        c.check(len(rates) == 3 and all(v > 1e6 for _, v in rates),
                "local ps received > 1 MB/s (1.6 MB of gradients a step): %r" % rates)
        c.check("staleness" not in histos, "no staleness histogram in sync mode")
        sizes = {"hidden1/weights": 392000, "hidden1/biases": 500, "softmax_linear/weights": 5000,
                 "softmax_linear/biases": 10}
        for var, size in sizes.items():
            for kind in ("weights", "gradients"):
                tag = "%s/%s" % (kind, var)
                got = histos.get(tag, [])
                c.check([s for s, _ in got] == [40, 80, 120], "%s at steps 40, 80, 120" % tag)
                if got:
                    check_histogram(c, tag, got[-1][1], size, limits)
        w = histos.get("weights/hidden1/weights", [(0, {"min": 0, "max": 0})])[-1][1]
        c.check(w["min"] < 0 < w["max"] and w["max"] < 10, "hidden1 weights spread around 0: [%g, %g]" %
                (w["min"], w["max"]))
        g = histos.get("gradients/softmax_linear/biases", [(0, {"sum": 1})])[-1][1]
        c.check(abs(g["sum"]) < 1e-3, "softmax bias gradients sum to ~0 (softmax cross-entropy): %g" % g["sum"])

        # 2. Async cluster, 2 ps tasks + 2 workers: staleness and traffic of each ps task.
        logdir = os.path.join(work, "cluster")
        cmd = [os.path.join(ROOT, "scripts", "run_local_cluster.sh"), "--ps", "2", "--workers", "2", "--logdir",
               os.path.join(work, "cluster_logs"), "--", "--model=mlp", "--mode=async", "--train_steps=200",
               "--log_every=50", "--summary_every=25", "--logdir=" + logdir]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, text=True,
                             env=dict(os.environ, DTRAIN_BIN=a.bin))
        print(out.stdout[-1500:])
        c.check(out.returncode == 0, "async cluster exits 0")
        scalars, histos = read_events(logdir)
        for t in (0, 1):
            for d in ("received", "sent"):
                tag = "ps/task_%d/%s_bytes_per_sec" % (t, d)
                v = scalars.get(tag, [])
                c.check(len(v) >= 2 and all(x > 0 for _, x in v), "%s: %d positive values" % (tag, len(v)))
        st = histos.get("staleness", [])
        c.check(len(st) >= 2, "staleness histograms: %d" % len(st))
        if st:
            h = st[-1][1]
            c.check(h["min"] >= 0 and h["max"] < 50 and h["num"] >= 50,
                    "staleness: min %g >= 0, max %g, %g pushes" % (h["min"], h["max"], h["num"]))
            c.check(st[-1][1]["num"] > st[0][1]["num"], "staleness counts grow over the run")
            check_histogram(c, "staleness", h, h["num"], limits)

        # 3. dlrm, sync cluster of 2 ps tasks + 2 workers, hash tables of at most 300 rows per task.
        check_dlrm(c, a.bin, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (1 if c.failures == 0 else 0, 1 if c.failures else 0))
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
