#!/usr/bin/python3
"""DLRM in PyTorch, as dtrain's --model=dlrm builds it, for comparisons in the same run (scripts/compare_dlrm.sh).

Reads Criteo-format text (train.txt, test.txt; `dtrain_convert --synthetic_ctr` writes such files) with dtrain's
own transforms: integer features log(1 + max(x, 0)), categorical values hashed to ids exactly as
worker/data/criteo.h does (CriteoId), taken modulo --table_rows (the hashing trick, dtrain's --table_rows).
The model: bottom MLP (ReLU after every layer, the last embedding_dim wide), one EmbeddingBag(sum) per
categorical feature, pairwise dot products of the bottom output and the embeddings (lower triangle), top MLP,
one logit, BCE-with-logits (the batch's mean). The initial values are drawn as dtrain draws them: MLP weights normal
with stddev sqrt(2 / (in + out)) truncated at 2 stddev, zero biases, rows uniform in +-1/sqrt(--table_rows); or
taken from dtrain itself with --init_from (below). Dense parameters train with --optimizer (default Adam:
torch.optim.Adam, TensorFlow's epsilon placement of dtrain's default adam is not reproduced; pytorch_adagrad as
dtrain_worker's --optimizer=pytorch_adagrad), the tables with Adagrad (initial accumulator 0.1, TensorFlow's
default; torch coalesces a row's repeats in a batch before squaring, as dtrain's ps sums a row's gradient per id),
as dtrain's dlrm.

Step by step against dtrain (tests/dlrm_pytorch_losses_test.py): --init_from=FILE.npz starts from dtrain's weights
(dtrain_eval --export of a dlrm checkpoint: its dense weights and held rows, every other row computed as dtrain's ps
creates it for dtrain_worker's --seed, --init_seed here), and --losses_out=FILE writes every step's loss as
dtrain_worker's --metrics_file does, for the same batches (dtrain_worker --shuffle=false).

  --mode=sparse      one process, sparse=True embeddings: only the touched rows' gradients and Adagrad state move
  --mode=dense       one process, dense embedding gradients
  --mode=ddp         --ranks processes, DistributedDataParallel over gloo with sparse=True embeddings: DDP
                     all-reduces the tables' sparse gradients as sparse tensors (gloo gathers every rank's indices
                     and values and sums them), the dense layers' as usual, and each rank steps sparse Adagrad on
                     its replica of the tables. What a DDP user would write: the DDP baseline.
  --mode=allgather   --ranks processes: the dense layers in DDP, the tables kept out of it; after backward each rank
                     coalesces its tables' gradients into one (ids, rows) list and exchanges it with all_gather (one
                     collective for the sizes, two for all tables' ids and rows), then applies the ranks' sum / ranks
                     with sparse Adagrad (the design of DLRM's reference code without model parallelism).
  --mode=ddp_dense   DDP with dense embedding gradients: all-reduces every table's whole gradient each step. A design
                     nobody should use with large tables; kept only to show that cost, and labelled as such.

Every mode averages the gradients over the ranks (dtrain's sync mode with every worker aggregated does the same),
each rank reads its own shard of the data in order (examples i with i % ranks == rank, as dtrain's workers), and
the global batch is ranks x --batch_size.

Prints one JSON line: examples/sec (all ranks together: median over timing windows of --window steps after
--warmup steps), the BLAS PyTorch loaded, and with --eval the test log loss and AUC. Run with /usr/bin/python3
(Debian's torch) and LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp: it refuses to time another BLAS
(exit 2) unless --any_blas (scripts/torch_blas.py).
"""
import argparse
import datetime
import faulthandler
import gzip
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_blas  # noqa: E402
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

MASK64 = (1 << 64) - 1
SALT = 0x63726974656F0000  # worker/data/criteo.h kCriteoHashSalt
MISSING = MASK64  # kCriteoMissingValue


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def read_layout(data_dir):
    num_dense, num_sparse = 13, 26
    path = os.path.join(data_dir, "criteo_layout.txt")
    if os.path.exists(path):
        for tok in open(path).read().split():
            k, v = tok.split("=")
            if k == "num_dense":
                num_dense = int(v)
            elif k == "num_sparse":
                num_sparse = int(v)
    return num_dense, num_sparse


def read_criteo(path, num_dense, num_sparse, rows, limit=0):
    opener = gzip.open if path.endswith(".gz") else open
    salts = [mix64((SALT + f) & MASK64) for f in range(num_sparse)]
    labels, dense, ids = [], [], []
    with opener(path, "rt") as f:
        for n, line in enumerate(f):
            if limit and n >= limit:
                break
            fields = line.rstrip("\r\n").split("\t")
            labels.append(float(fields[0]))
            dense.append([math.log1p(int(x)) if x and int(x) > 0 else 0.0 for x in fields[1:1 + num_dense]])
            row = []
            for j, v in enumerate(fields[1 + num_dense:1 + num_dense + num_sparse]):
                value = int(v, 16) if v else MISSING
                i = mix64(value ^ salts[j]) & ((1 << 63) - 1)
                row.append(i % rows)
            ids.append(row)
    return (torch.tensor(dense, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(labels, dtype=torch.float32))


class Dlrm(nn.Module):
    def __init__(self, num_dense, num_sparse, dim, bottom, top, rows, sparse):
        super().__init__()
        layers, prev = [], num_dense
        for w in bottom + [dim]:
            layers += [nn.Linear(prev, w), nn.ReLU()]
            prev = w
        self.bottom = nn.Sequential(*layers)
        bound = 1.0 / math.sqrt(rows)
        self.tables = nn.ModuleList()
        for _ in range(num_sparse):
            t = nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse)
            nn.init.uniform_(t.weight, -bound, bound)
            self.tables.append(t)
        f = num_sparse + 1
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)
        layers, prev = [], dim + f * (f - 1) // 2
        for w in top:
            layers += [nn.Linear(prev, w), nn.ReLU()]
            prev = w
        layers.append(nn.Linear(prev, 1))
        self.top = nn.Sequential(*layers)
        for m in list(self.bottom) + list(self.top):
            if isinstance(m, nn.Linear):
                # dtrain's: stddev sqrt(2 / (in + out)), drawn again beyond 2 stddev (worker/models/dlrm.cc).
                std = math.sqrt(2.0 / (m.in_features + m.out_features))
                nn.init.trunc_normal_(m.weight, 0.0, std, -2.0 * std, 2.0 * std)
                nn.init.zeros_(m.bias)

    def forward(self, dense, ids):
        b = self.bottom(dense)
        offsets = torch.arange(ids.shape[0], dtype=torch.int64)
        z = torch.stack([b] + [t(ids[:, k], offsets) for k, t in enumerate(self.tables)], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([b, dots], dim=1)).squeeze(1)


def dtrain_initial_rows(table, rows, dim, seed):
    """Rows [0, rows) of table number `table` as dtrain's ps creates them (ps/api/ps_types.cc SparseInitialRow, with
    worker/models/dlrm.cc's init_scale 1/sqrt(rows) in float): uniform in [-scale, scale) from a hash of (seed,
    table, id, column), as float32 [rows, dim]."""
    u64 = np.uint64

    def mix(x):  # SplitMix64's step (ps_types.cc Mix)
        x = x + u64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> u64(30))) * u64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> u64(27))) * u64(0x94D049BB133111EB)
        return x ^ (x >> u64(31))

    scale = np.float64(np.float32(1.0) / np.sqrt(np.float32(rows)))
    out = np.empty((rows, dim), np.float32)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as in C++
        key = mix(u64(seed) ^ mix(u64(table + 1)) ^ mix(np.arange(rows, dtype=np.uint64) * u64(0xD6E8FEB86659FD93)))
        for k in range(dim):
            u = (mix(key + u64(k)) >> u64(11)).astype(np.float64) * 2.0 ** -53
            out[:, k] = (2.0 * u - 1.0) * scale
    return out


def load_dtrain_weights(model, path, seed):
    """--init_from: the dense weights and the held rows of `path` (dtrain_eval --export=FILE.npz of a dlrm
    checkpoint), every other row as dtrain's ps would create it with --seed=`seed`."""
    z = np.load(path)

    def array(name):
        if name not in z:
            sys.exit("dlrm_pytorch.py: --init_from=%s has no array %s (a dtrain_eval --export of a dlrm checkpoint "
                     "with this script's --dim, --bottom, --top and --table_rows?)" % (path, name))
        return z[name]

    with torch.no_grad():
        for prefix, seq in (("bottom", model.bottom), ("top", model.top)):
            for k, m in enumerate(x for x in seq if isinstance(x, nn.Linear)):
                w, b = array("%s%d_weights" % (prefix, k)), array("%s%d_biases" % (prefix, k))
                if w.shape != (m.in_features, m.out_features):
                    sys.exit("dlrm_pytorch.py: --init_from: %s%d_weights is %s, the model's layer %d x %d" %
                             (prefix, k, w.shape, m.in_features, m.out_features))
                m.weight.copy_(torch.from_numpy(w.T.copy()))  # dtrain's [in, out], PyTorch's [out, in]
                m.bias.copy_(torch.from_numpy(b))
        for t, table in enumerate(model.tables):
            rows, dim = table.weight.shape
            w = dtrain_initial_rows(t, rows, dim, seed)
            ids, values = array("embedding_C%d_ids" % (t + 1)), array("embedding_C%d_values" % (t + 1))
            if values.shape != (len(ids), dim) or (len(ids) and (ids.min() < 0 or ids.max() >= rows)):
                sys.exit("dlrm_pytorch.py: --init_from: table %d holds rows of %s floats, ids up to %s: not a table of "
                         "--table_rows=%d x --dim=%d" % (t + 1, values.shape[1:], ids.max() if len(ids) else "-",
                                                        rows, dim))
            w[ids] = values
            table.weight.copy_(torch.from_numpy(w))


def make_optimizers(model, args):
    table_params = [p for t in model.tables for p in t.parameters()]
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    if args.optimizer in ("adam", "pytorch_adam"):
        dense = torch.optim.Adam(dense_params, lr=args.learning_rate)
    elif args.optimizer == "pytorch_adagrad":
        dense = torch.optim.Adagrad(dense_params, lr=args.learning_rate,
                                    initial_accumulator_value=args.initial_accumulator)
    else:
        dense = torch.optim.SGD(dense_params, lr=args.learning_rate)
    return [dense, torch.optim.Adagrad(table_params, lr=args.sparse_learning_rate, initial_accumulator_value=0.1)]


def exchange_table_gradients(model, world):
    """--mode=allgather: every rank's sparse table gradients, all_gathered and summed / world into each table's .grad
    (one exchange for all tables: ids are offset by table so that they stay apart)."""
    rows = model.tables[0].weight.shape[0]
    dim = model.tables[0].weight.shape[1]
    ids, vals = [], []
    for k, t in enumerate(model.tables):
        g = t.weight.grad.coalesce()
        ids.append(g.indices()[0] + k * rows)
        vals.append(g.values())
    ids, vals = torch.cat(ids), torch.cat(vals)
    n = torch.tensor([ids.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    most = int(max(s.item() for s in sizes))
    pad_ids = torch.zeros(most, dtype=torch.int64)
    pad_ids[:ids.numel()] = ids
    pad_vals = torch.zeros(most, dim)
    pad_vals[:ids.numel()] = vals
    all_ids = [torch.empty_like(pad_ids) for _ in range(world)]
    all_vals = [torch.empty_like(pad_vals) for _ in range(world)]
    dist.all_gather(all_ids, pad_ids)
    dist.all_gather(all_vals, pad_vals)
    ids = torch.cat([a[:int(s.item())] for a, s in zip(all_ids, sizes)])
    vals = torch.cat([a[:int(s.item())] for a, s in zip(all_vals, sizes)]) / world
    table_of = ids // rows
    for k, t in enumerate(model.tables):
        mine = table_of == k
        t.weight.grad = torch.sparse_coo_tensor((ids[mine] - k * rows).unsqueeze(0), vals[mine], t.weight.shape)


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    s, l = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):  # average ranks of ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    pos = l.sum()
    neg = len(l) - pos
    return float((ranks[l == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def dump_stacks_on_sigterm():
    """SIGTERM (what compare_dlrm.py sends a launch past its --timeout) prints every thread's stack, then ends the
    process as SIGTERM would: a hang says where it hung."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def train(rank, world, args, data):
    dump_stacks_on_sigterm()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if world > 1:
        # The ranks meet through a file, not a TCP port: no port to race for with other processes on the host.
        # The timeout bounds the rendezvous and every collective (gloo's default is 30 minutes).
        dist.init_process_group("gloo", init_method="file://" + args.rendezvous, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=args.timeout))
    blas = torch_blas.require_openblas_openmp("dlrm_pytorch.py", args.any_blas)
    num_dense, num_sparse, (dense, ids, labels), test = data
    sparse = args.mode in ("sparse", "ddp", "allgather")
    model = Dlrm(num_dense, num_sparse, args.dim, args.bottom, args.top, args.table_rows, sparse)
    if args.init_from:
        load_dtrain_weights(model, args.init_from, args.init_seed)
    if args.mode == "allgather":
        # The tables stay out of DDP: their gradients are exchanged by exchange_table_gradients.
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, ["tables.%d.weight" % k for k in range(num_sparse)])
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opts = make_optimizers(model, args)
    loss_fn = nn.BCEWithLogitsLoss()
    n = dense.shape[0]
    # Each rank reads its own shard, in order (examples i with i % world == rank), as dtrain's workers do.
    shard = torch.arange(rank, n, world)
    times, window_start, losses = [], None, []
    steps_per_epoch = len(shard) // args.batch_size
    for step in range(args.steps):
        k = step % steps_per_epoch
        idx = shard[k * args.batch_size:(k + 1) * args.batch_size]
        if step == args.warmup:
            window_start = time.perf_counter()
        out = net(dense[idx], ids[idx])
        loss = loss_fn(out, labels[idx])
        losses.append(loss.item())
        for o in opts:
            o.zero_grad()
        loss.backward()
        if args.mode == "allgather":
            exchange_table_gradients(model, world)
        for o in opts:
            o.step()
        if window_start is not None and (step - args.warmup + 1) % args.window == 0:
            now = time.perf_counter()
            times.append(now - window_start)
            window_start = now
    result = {}
    if rank == 0:
        per_window = args.window * args.batch_size * world
        rates = [per_window / t for t in times] or [float("nan")]
        result = {"mode": args.mode, "ranks": world, "threads": args.threads, "batch": args.batch_size,
                  "table_rows": args.table_rows, "steps": args.steps, "torch": torch.__version__, "blas": blas,
                  "examples_per_sec": statistics.median(rates), "windows": len(rates),
                  "window_rates": [round(r, 1) for r in rates]}
        if args.eval and test is not None:
            tdense, tids, tlabels = test
            model.eval()
            with torch.no_grad():
                logits = torch.cat([model(tdense[i:i + 4096], tids[i:i + 4096]) for i in range(0, len(tlabels), 4096)])
            p = torch.sigmoid(logits).numpy().astype(np.float64)
            y = tlabels.numpy()
            eps = 1e-12
            result["test_log_loss"] = float(-np.mean(y * np.log(np.maximum(p, eps)) +
                                                     (1 - y) * np.log(np.maximum(1 - p, eps))))
            result["test_auc"] = auc(logits.numpy().astype(np.float64), y)
        if args.losses_out:
            with open(args.losses_out, "w") as f:
                f.write("local_step,loss\n" + "".join("%d,%.9g\n" % (i + 1, l) for i, l in enumerate(losses)))
        print(json.dumps(result), flush=True)
    if world > 1:
        # Every rank is past its last collective; then out without tearing the objects down: PyTorch 1.13 at times
        # hangs for good in a rank's teardown of DDP and gloo after training (seen here in about one 2-rank launch
        # of five, the rank's stack ending in spawn's _wrap with garbage collection running).
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data_dir", required=True)
    ap.add_argument("--mode", choices=["sparse", "dense", "ddp", "allgather", "ddp_dense"], default="sparse")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch_size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--bottom", default="64")
    ap.add_argument("--top", default="128,64")
    ap.add_argument("--table_rows", type=int, default=1000000)
    ap.add_argument("--optimizer", choices=["adam", "pytorch_adam", "pytorch_adagrad", "sgd"], default="adam",
                    help="the dense layers' optimizer, as dtrain_worker's --optimizer names it: adam and pytorch_adam "
                         "are torch.optim.Adam (dtrain's dlrm default, adam, is TensorFlow's: epsilon placed apart), "
                         "pytorch_adagrad torch.optim.Adagrad with its defaults, sgd torch.optim.SGD")
    ap.add_argument("--learning_rate", type=float, default=1e-3)
    ap.add_argument("--initial_accumulator", type=float, default=0.0,
                    help="--optimizer=pytorch_adagrad: the accumulator's start (dtrain_worker's --initial_accumulator)")
    ap.add_argument("--sparse_learning_rate", type=float, default=0.05)
    ap.add_argument("--train_examples", type=int, default=0, help="read at most this many (0: all)")
    ap.add_argument("--eval", action="store_true", help="test log loss and AUC at the end")
    ap.add_argument("--losses_out", default="",
                    help="write rank 0's loss of every step here, as CSV local_step,loss (as dtrain_worker's "
                         "--metrics_file)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init_from", default="",
                    help="start from dtrain's weights: an .npz of dtrain_eval --export of a dlrm checkpoint (the dense "
                         "weights and the rows it holds; every other row as dtrain's ps creates it with --init_seed)")
    ap.add_argument("--init_seed", type=int, default=1, help="dtrain_worker's --seed, for the rows --init_from lacks")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds the ranks' rendezvous and each collective may take before the launch fails")
    ap.add_argument("--any_blas", action="store_true",
                    help="time it even when PyTorch did not load the OpenMP OpenBLAS (the JSON names the BLAS)")
    args = ap.parse_args()
    dump_stacks_on_sigterm()
    if args.timeout < 1:
        ap.error("--timeout must be a positive number of seconds")
    args.bottom = [int(x) for x in args.bottom.split(",") if x]
    args.top = [int(x) for x in args.top.split(",") if x]
    num_dense, num_sparse = read_layout(args.data_dir)

    def find(name):
        for p in (os.path.join(args.data_dir, name), os.path.join(args.data_dir, name + ".gz")):
            if os.path.exists(p):
                return p
        sys.exit(f"dlrm_pytorch.py: no {name}[.gz] in {args.data_dir}")

    train_data = read_criteo(find("train.txt"), num_dense, num_sparse, args.table_rows, args.train_examples)
    test = read_criteo(find("test.txt"), num_dense, num_sparse, args.table_rows) if args.eval else None
    data = (num_dense, num_sparse, train_data, test)
    if args.mode in ("ddp", "allgather", "ddp_dense"):
        with tempfile.TemporaryDirectory(prefix="dlrm_pytorch.") as d:
            args.rendezvous = os.path.join(d, "rendezvous")
            mp.spawn(train, args=(args.ranks, args, data), nprocs=args.ranks, join=True)
    else:
        train(0, 1, args, data)


if __name__ == "__main__":
    main()
