#!/usr/bin/env bash
# Installs the Debian packages dtrain needs (only those missing). Safe to run again.
set -euo pipefail
pkgs=(cmake g++ make pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
      libdnnl-dev ocl-icd-opencl-dev libgoogle-glog-dev nlohmann-json3-dev zlib1g-dev libgtest-dev libgmock-dev
      libbenchmark-dev libssl-dev openssl dataset-fashion-mnist libonnx-dev
      # Image folders: JPEG (libjpeg-turbo, libjpeg API) and PNG (libspng) decoders; torchvision and PIL for the
      # tests that compare with ImageFolder and its transforms, and scripts/compare_input_pipeline.py.
      libjpeg62-turbo-dev libspng-dev python3-torchvision python3-pil
      # The ONNX tests: each operator's reference data, PyTorch to export models and train them beside dtrain,
      # numpy and onnx for /usr/bin/python3 (npz_writer_test, the PyTorch equivalence test); the OpenMP OpenBLAS
      # every comparison with PyTorch runs it on (scripts/torch_blas.py refuses another BLAS; compare_dlrm_test).
      libonnx-testdata python3-torch python3-onnx python3-numpy libopenblas0-openmp
      clang libclang-rt-dev  # clang + libFuzzer/ASan/UBSan runtimes for scripts/fuzz.sh (gcc's come with g++)
      # The deployment tests: a real Slurm on this machine, network namespaces with tc, sshd across them.
      slurmctld slurmd slurm-client munge iproute2 procps openssh-server openssh-client
      # Emulated hosts' link delay where the kernel has no netem (tests/netdelay's dtrain_netdelay on an NFQUEUE),
      # and ping to see it.
      libnetfilter-queue-dev libmnl-dev iptables iputils-ping
      # The pictures beside every comparison's table (compare_cluster_sizes, the planner, compare_pytorch.py
      # --plot): matplotlib for Debian's /usr/bin/python3.
      python3-matplotlib
      # --metrics_port: prometheus-cpp (counters, the text format; its CMake config asks for CivetWeb) served by
      # libmicrohttpd, and a real Prometheus server for tests/metrics_prometheus_test.sh (docs/metrics.md).
      # curl reads /metrics in docs/metrics.md.
      prometheus-cpp-dev libcivetweb-dev libmicrohttpd-dev prometheus curl)
# Node.js runs the offline Kubernetes manifest validator (its npm packages are installed at the end).
command -v npm >/dev/null || pkgs+=(nodejs npm)
# DTRAIN_WITH_PLOTS=1 and DTRAIN_WITH_TORCH=1 are accepted and change nothing: matplotlib, PyTorch and the OpenMP
# OpenBLAS are part of the default set above.
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The Kubernetes validator's npm packages (pinned by deploy/kubernetes/validate/package-lock.json), into
# deploy/kubernetes/validate/node_modules.
install_validator() {
  local v
  v="$(cd "$(dirname "$0")/.." && pwd)/deploy/kubernetes/validate"
  [ -d "$v/node_modules/kubernetes-models" ] && [ -d "$v/node_modules/yaml" ] && return 0
  echo "installing the Kubernetes manifest validator's npm packages into $v/node_modules"
  (cd "$v" && npm ci --no-audit --no-fund --loglevel=error)
}
# onnxruntime-node for tests/onnx_e2e_test.sh (pinned by tests/onnxruntime/package-lock.json), into
# tests/onnxruntime/node_modules. Its install script would download CUDA binaries from outside: skipped (the
# package bundles the CPU runtime).
install_onnxruntime() {
  local d
  d="$(cd "$(dirname "$0")/.." && pwd)/tests/onnxruntime"
  [ -d "$d/node_modules/onnxruntime-node" ] && return 0
  echo "installing onnxruntime-node into $d/node_modules"
  (cd "$d" && ONNXRUNTIME_NODE_INSTALL_CUDA=skip npm ci --no-audit --no-fund --loglevel=error)
}
if [ ${#missing[@]} -eq 0 ]; then install_validator && install_onnxruntime; exit $?; fi
echo "installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
# Packages with daemons (munge, slurmctld, slurmd, sshd) must not start them: the tests start their own, with
# private configs. A policy-rc.d that says 101 makes invoke-rc.d/deb-systemd-invoke skip every start; one we
# add is removed again, one already there is left alone.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# added by dtrain scripts/install_deps.sh while it installs\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  trap '$SUDO rm -f "$policy"' EXIT
fi
$SUDO apt-get update -qq -o DPkg::Lock::Timeout=300 || true
$SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}"
install_validator
install_onnxruntime
