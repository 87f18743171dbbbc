#!/usr/bin/env bash
# Installs the Debian packages dtrain needs (only those missing). Safe to run again.
set -euo pipefail
pkgs=(cmake g++ make pkg-config libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
      libdnnl-dev ocl-icd-opencl-dev libgoogle-glog-dev nlohmann-json3-dev zlib1g-dev libgtest-dev libgmock-dev
      libbenchmark-dev dataset-fashion-mnist
      clang libclang-rt-dev)  # clang + libFuzzer/ASan/UBSan runtimes for scripts/fuzz.sh (gcc's come with g++)
# DTRAIN_WITH_PLOTS=1: matplotlib for compare_cluster_sizes --plot; DTRAIN_WITH_TORCH=1: what
# scripts/compare_pytorch.py needs (PyTorch with the OpenMP OpenBLAS, numpy).
if [ "${DTRAIN_WITH_PLOTS:-0}" = 1 ]; then pkgs+=(python3-matplotlib); fi
if [ "${DTRAIN_WITH_TORCH:-0}" = 1 ]; then pkgs+=(python3-torch libopenblas0-openmp python3-numpy); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq -o DPkg::Lock::Timeout=300 || true
$SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}"
