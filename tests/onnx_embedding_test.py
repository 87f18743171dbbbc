#!/usr/bin/python3
"""dtrain trains a PyTorch click-through-rate model with nn.Embedding, exported as ONNX, as PyTorch trains it.

Two small CTR models (below), each exported in training mode:
  PerFeature  one nn.Embedding per categorical feature (7, 50 and 200 rows: ids collide, rows are shared), the
              embeddings concatenated with the dense features, an MLP, one logit;
  OneTable    one nn.Embedding over the [N, F] ids, its [N, F, dim] output flattened and summed over F (.sum(1)),
              both concatenated with the dense features, an MLP, one logit.
On a tiny synthetic data set (dtrain_convert --synthetic_ctr: 4 dense, 3 categorical features):
  1. dtrain_worker --job_name=local --data_format=criteo --shuffle=false trains the file for STEPS steps with
     SGD, then with --optimizer=pytorch_adam; the table rows on the ps with --sparse_optimizer=sgd at the same
     learning rate. PyTorch trains the module, loaded from the same file's initializers, on the same batches
     with BCEWithLogitsLoss: its dense parameters with torch.optim.SGD / torch.optim.Adam, the embeddings with
     torch.optim.SGD (SGD on nn.Embedding's dense gradient changes exactly the touched rows, by what sparse SGD
     on the ps does). Every step's loss (--metrics_file) must agree within 1e-4 relative.
  2. The trained file (dtrain_worker --export_onnx: the chief pulls every row of the tables at the end) and the
     checkpoint exported by dtrain_eval --export (rows the checkpoint lacks keep the file's values) load into
     the module with load_state_dict(strict=True); both hold PyTorch's trained weights (1e-5), and the module's
     test log loss and AUC equal dtrain's (the chief's final evaluation) to 1e-4. dtrain_eval on the checkpoint
     and on the exported file alone (its tables read from the file) prints the chief's figures.

The ids: dtrain hashes each categorical value (worker/data/criteo.h CriteoId) and a fixed-size table takes the
id modulo its rows (TableInfo::RowId); the PyTorch side computes the same row indices (scripts/dlrm_pytorch.py
has the hash in Python).

Exit 77 (skipped) without PyTorch, numpy or onnx. Runs with /usr/bin/python3 (Debian's torch).

  /usr/bin/python3 tests/onnx_embedding_test.py [--bin build/bin] [--steps 30] [--verbose]
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from skipping import skip  # noqa: E402

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # the CI machine installs them (scripts/install_deps.sh)
    skip("%s (apt-get install python3-torch python3-onnx python3-numpy)" % e)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loss_comparison import compare_losses, run, within, worst_of  # noqa: E402

MASK64 = (1 << 64) - 1
SALT = 0x63726974656F0000  # worker/data/criteo.h kCriteoHashSalt
MISSING = MASK64  # kCriteoMissingValue
DENSE, SPARSE, DIM = 4, 3, 4


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def read_criteo(path):
    """dtrain's transforms: dense log(1 + max(x, 0)) in float32, ids CriteoId(f, value) (not yet modulo rows)."""
    salts = [mix64((SALT + f) & MASK64) for f in range(SPARSE)]
    labels, dense, ids = [], [], []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\r\n").split("\t")
            labels.append(float(fields[0]))
            dense.append([math.log1p(int(x)) if x and int(x) > 0 else 0.0 for x in fields[1:1 + DENSE]])
            ids.append([mix64((int(v, 16) if v else MISSING) ^ salts[j]) & ((1 << 63) - 1)
                        for j, v in enumerate(fields[1 + DENSE:1 + DENSE + SPARSE])])
    return (torch.tensor(dense, dtype=torch.float32), ids, torch.tensor(labels, dtype=torch.float32))


class PerFeature(nn.Module):
    ROWS = (7, 50, 200)

    def __init__(self):
        super().__init__()
        self.emb = nn.ModuleList([nn.Embedding(r, DIM) for r in self.ROWS])
        self.fc1 = nn.Linear(DENSE + SPARSE * DIM, 16)
        self.fc2 = nn.Linear(16, 1)

    def rows(self, ids):
        return torch.tensor([[i % r for i, r in zip(row, self.ROWS)] for row in ids], dtype=torch.int64)

    def forward(self, dense, ids):
        e = [m(ids[:, f]) for f, m in enumerate(self.emb)]
        return self.fc2(torch.relu(self.fc1(torch.cat([dense] + e, dim=1))))


class OneTable(nn.Module):
    ROWS = 40

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(self.ROWS, DIM)
        self.fc1 = nn.Linear(DENSE + SPARSE * DIM + DIM, 16)
        self.fc2 = nn.Linear(16, 1)

    def rows(self, ids):
        return torch.tensor([[i % self.ROWS for i in row] for row in ids], dtype=torch.int64)

    def forward(self, dense, ids):
        e = self.emb(ids)
        return self.fc2(torch.relu(self.fc1(torch.cat([dense, e.flatten(1), e.sum(1)], dim=1))))


def export(module, path):
    module.train()
    torch.onnx.export(module, (torch.zeros(2, DENSE), torch.zeros(2, SPARSE, dtype=torch.int64)), path,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["dense", "ids"], output_names=["logit"],
                      dynamic_axes={"dense": {0: "N"}, "ids": {0: "N"}, "logit": {0: "N"}})


def load_initializers(module, path):
    model = onnx.load(path)
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
    module.load_state_dict({name: inits[name] for name in module.state_dict()}, strict=True)


def auc(scores, labels):
    """ROC AUC with tied scores counted half (the Mann-Whitney statistic over average ranks)."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return (ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--verbose", action="store_true", help="print every step's relative difference")
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="dtrain_onnx_embedding.")
    data = os.path.join(work, "ctr")
    run([os.path.join(a.bin, "dtrain_convert"), "--synthetic_ctr", "--out=" + data,
         "--examples=%d" % (a.steps * a.batch), "--test_examples=600", "--num_dense=%d" % DENSE,
         "--num_sparse=%d" % SPARSE, "--seed=3"])
    train_dense, train_ids, train_y = read_criteo(os.path.join(data, "train.txt"))
    test_dense, test_ids, test_y = read_criteo(os.path.join(data, "test.txt"))

    optimizers = [("sgd", 0.1), ("pytorch_adam", 0.01)]
    failures = []
    worst = {"sgd": 0.0, "pytorch_adam": 0.0}
    for make in (PerFeature, OneTable):
        name = make.__name__
        torch.manual_seed(1)
        path = os.path.join(work, name + ".onnx")
        export(make(), path)
        for opt, lr in optimizers:
            tag = "%s/%s" % (name, opt)
            ckpt = os.path.join(work, tag.replace("/", "_") + ".ckpt")
            metrics, exported = ckpt + ".csv", ckpt + ".worker.onnx"
            out = run([os.path.join(a.bin, "dtrain_worker"), "--job_name=local", "--model=" + path,
                       "--data_dir=" + data, "--data_format=criteo", "--train_steps=%d" % a.steps,
                       "--batch_size=%d" % a.batch, "--optimizer=" + opt, "--learning_rate=%g" % lr,
                       "--sparse_optimizer=sgd", "--sparse_learning_rate=%g" % lr, "--shuffle=false",
                       "--threads=1", "--log_every=1000000", "--checkpoint_dir=" + ckpt, "--metrics_file=" + metrics,
                       "--export_onnx=" + exported])
            m = re.search(r"test log loss = ([0-9.]+), AUC = ([0-9.]+)", out)
            if m is None:
                failures.append("%s: dtrain printed no test log loss and AUC:\n%s" % (tag, out[-2000:]))
                continue
            dtrain_log_loss, dtrain_auc = float(m.group(1)), float(m.group(2))
            with open(metrics) as f:
                dtrain_losses = [float(line.split(",")[1]) for line in f.read().splitlines()[1:]]

            # PyTorch on the same batches: dense parameters with the run's optimizer, the tables with SGD.
            module = make()
            load_initializers(module, path)
            module.train()
            tables = [p for n, p in module.named_parameters() if n.startswith("emb")]
            dense = [p for n, p in module.named_parameters() if not n.startswith("emb")]
            optims = [torch.optim.SGD(tables, lr=lr),
                      torch.optim.SGD(dense, lr=lr) if opt == "sgd" else
                      torch.optim.Adam(dense, lr=lr, betas=(0.9, 0.999), eps=1e-8)]
            torch_losses = []
            for k in range(a.steps):
                s = slice(k * a.batch, (k + 1) * a.batch)
                for o in optims:
                    o.zero_grad()
                logit = module(train_dense[s], module.rows(train_ids[s]))
                loss = F.binary_cross_entropy_with_logits(logit, train_y[s].view(-1, 1))
                loss.backward()
                for o in optims:
                    o.step()
                torch_losses.append(loss.item())
            worst[opt] = worst_of([worst[opt], compare_losses(tag, dtrain_losses, torch_losses, failures, a.verbose,
                                                              width=24)])

            # The trained file, from the worker and from the checkpoint, back in PyTorch.
            from_eval = ckpt + ".eval.onnx"
            evals = [run([os.path.join(a.bin, "dtrain_eval"), "--checkpoint=" + ckpt, "--model=" + path,
                          "--export=" + from_eval, "--data_dir=" + data]),
                     run([os.path.join(a.bin, "dtrain_eval"), "--model=" + exported, "--data_dir=" + data])]
            # dtrain_eval on the checkpoint, and on the exported file's own weights (its tables' rows included),
            # reports the chief's final evaluation.
            for what, text in zip(("the checkpoint", "the exported file"), evals):
                m = re.search(r"test log loss = ([0-9.]+), AUC = ([0-9.]+)", text)
                if m is None or (float(m.group(1)), float(m.group(2))) != (dtrain_log_loss, dtrain_auc):
                    failures.append("%s: dtrain_eval on %s: %s; the chief reported log loss %.4f, AUC %.4f" %
                                    (tag, what, text.strip().splitlines()[-1], dtrain_log_loss, dtrain_auc))
            trained = module.state_dict()
            for what, file in (("dtrain_worker --export_onnx", exported), ("dtrain_eval --export", from_eval)):
                onnx.checker.check_model(onnx.load(file))
                back = make()
                load_initializers(back, file)
                weights = worst_of(float((back.state_dict()[n] - trained[n]).abs().max()) for n in trained)
                back.eval()
                with torch.no_grad():
                    logits = back(test_dense, back.rows(test_ids)).view(-1)
                    log_loss = float(F.binary_cross_entropy_with_logits(logits.double(), test_y.double()))
                    area = float(auc(logits.numpy(), test_y.numpy()))
                print("%-24s %s: weights within %.1e of PyTorch's; test log loss %.6f (dtrain %.4f), AUC %.6f "
                      "(dtrain %.4f)" % (tag, what, weights, log_loss, dtrain_log_loss, area, dtrain_auc))
                if not within(weights, 1e-5):
                    failures.append("%s: %s holds weights %.2e from PyTorch's trained ones" % (tag, what, weights))
                # dtrain prints 4 decimals: equal to 1e-4 means within 1e-4 of the rounded figure.
                if not (within(abs(log_loss - dtrain_log_loss), 1e-4) and within(abs(area - dtrain_auc), 1e-4)):
                    failures.append("%s: %s gives test log loss %.6f, AUC %.6f; dtrain %.4f, %.4f" %
                                    (tag, what, log_loss, area, dtrain_log_loss, dtrain_auc))
    print("largest relative loss difference: SGD %.2e, pytorch_adam (against torch.optim.Adam) %.2e" %
          (worst["sgd"], worst["pytorch_adam"]))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    subprocess.run(["rm", "-rf", work])
    print("PASS")


if __name__ == "__main__":
    main()
