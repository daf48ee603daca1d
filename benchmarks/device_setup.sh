# Sourced by the scripts that run on a lent GPU machine (the `run` device tool), from the
# repository root: rebuilds the shared mirror that .gpu/ carries and installs the wheels
# the device image lacks. Sets S (a temporary folder, removed on exit) and MIRROR, and
# puts the wheels on PYTHONPATH. Prepare .gpu/ here once (.git/info/exclude ignores it;
# ../shared/gpu/README.md):
#   bash ../shared/gpu/pack_mirror.sh .gpu
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_17_x86_64 -d .gpu/whl ml-collections threadpoolctl
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
_started=$(date +%s)
mkdir -p "$S/csv" "$S/site"
xz -T0 -dc .gpu/mirror7.tar.xz | tar xf - -C "$S/csv"
python3 .gpu/rebuild.py "$S/csv/csv7" "$S/mirror" >/dev/null
python3 -m pip install --quiet --no-index --no-deps --target "$S/site" .gpu/whl/*.whl
export PYTHONPATH="$S/site:$PWD"
MIRROR="$S/mirror"
echo "mirror and wheels ready in $(($(date +%s) - _started)) s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
