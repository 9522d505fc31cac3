#!/usr/bin/env bash
# Ray for the device machine (STEP=ray in gpu_check.sh): the device image has no Ray and its wheel
# (79 MB) is over what a call carries, so it travels unpacked, without the parts kgen never imports
# (Java jars, the dashboard's web client, rllib, data, serve, tune, train), as one .tar.xz (28 MB),
# with the four packages Ray needs that the image lacks (unzip, not zipfile: the servers need their exec bits).
#     bash bench/pack_ray.sh        then carry ".ray"
set -euo pipefail
VERSION=${RAY_VERSION:-2.60.0}
where=$(mktemp -d)
pick="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64"
python3 -m pip download $pick -d "$where" "ray==$VERSION"
mkdir -p .ray "$where/x"
python3 -m pip download $pick -d .ray jsonschema referencing jsonschema-specifications rpds-py
(cd "$where/x" && unzip -q "$where"/ray-*.whl \
   && rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/data ray/serve ray/tune ray/train)
tar -C "$where/x" -cf - . | xz -6 -T0 > .ray/ray-stripped.tar.xz
rm -rf "$where"
ls -la .ray
