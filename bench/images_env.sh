#!/usr/bin/env bash
# bench/.venv-images: the environment of bench/images.py's peers, kept out of
# the test environment (.venv). It holds conveyor with its images extra,
# torch (CPU), NVIDIA DALI (its CPU-only pipelines run without a GPU), FFCV
# 1.0.2 (built here against Debian's libturbojpeg and OpenCV), spdl, and the
# decode libraries whose two-core ceilings the benchmark measures (simplejpeg,
# OpenCV). Pillow-SIMD replaces Pillow where it is installed, so
# it gets an environment of its own, bench/.venv-pillow-simd.
#
#   bash bench/images_env.sh            # both environments (a few minutes; FFCV and Pillow-SIMD compile)
#   bench/.venv-images/bin/python bench/images.py --json > bench/results-images.json
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=bench/.venv-images
SIMD=bench/.venv-pillow-simd

# FFCV's C extension: pkg-config finds libturbojpeg and opencv4; Pillow-SIMD: libjpeg and zlib.
need=()
for pkg in pkg-config libturbojpeg0-dev libopencv-dev libjpeg-dev zlib1g-dev libgl1; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel
"$VENV/bin/pip" install -q -e '.[images]' torch==2.13.0 \
    nvidia-dali-cuda120==2.4.0 spdl==0.8.0 simplejpeg==1.9.0 \
    numba terminaltables pytorch_pfn_extras fastargs assertpy tqdm psutil
# FFCV asks for opencv-python; the headless build of the same OpenCV serves it.
"$VENV/bin/pip" install -q --no-deps --no-build-isolation ffcv==1.0.2

test -x "$SIMD/bin/python" || "$PYTHON" -m venv "$SIMD"
"$SIMD/bin/pip" install -q --upgrade pip setuptools wheel
"$SIMD/bin/pip" install -q numpy cloudpickle
"$SIMD/bin/pip" install -q --no-binary pillow-simd pillow-simd==12.1.1.post0
"$SIMD/bin/pip" install -q --no-deps -e .  # (conveyor, for the crop boxes; Pillow-SIMD stays its PIL)
echo "ready: $VENV, $SIMD"
