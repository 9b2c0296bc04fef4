#!/bin/bash
# An aarch64 Python 3.11 with onnxruntime, numpy and tokenizers under qemu's user-mode emulation, on an x86-64
# Debian 12 machine (as root): what scripts/aarch64/check.py runs edgespec's kernels' portable path on (README,
# "aarch64"). Idempotent: re-run freely (about 30 s the first time).
#   ARM=/tmp/edgespec-aarch64   where everything goes
#   ORT_VERSION=1.22.1      onnxruntime aarch64 wheel version (cp311)
#   EXTRA_PKGS="a b"        more aarch64 wheels for the site dir
#   ARM_BINFMT=0            skip the binfmt_misc registration
# Host system is only touched by installing qemu-user + the aarch64 cross g++
# (amd64 packages) and (optionally) a binfmt_misc entry. The arm64 .debs are
# fetched with a PRIVATE apt state in $ARM/apt and unpacked with dpkg -x into
# $ARM/root (no dpkg --add-architecture, nothing arm64 installed on the host).
set -euo pipefail
ARM=${ARM:-/tmp/edgespec-aarch64}
ORT_VERSION=${ORT_VERSION:-1.22.1}
mkdir -p "$ARM"
cd "$ARM"

# ---- 1. host tools --------------------------------------------------------
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-g++ >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user g++-aarch64-linux-gnu
fi

# ---- 2. arm64 sysroot via private apt state ---------------------------------
A="$ARM/apt"
mkdir -p "$A/lists/partial" "$A/archives/partial" "$A/etc/preferences.d" "$A/etc/apt.conf.d"
touch "$A/status"
# the sources this machine's apt uses (its Debian release and mirror), for arm64
mkdir -p "$A/etc/sources.list.d"
: > "$A/etc/sources.list"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  sed '/^Types:/a Architectures: arm64' /etc/apt/sources.list.d/debian.sources > "$A/etc/sources.list.d/debian.sources"
else
  sed -n 's/^deb \(\[[^]]*\] \)\?/deb [arch=arm64] /p' /etc/apt/sources.list > "$A/etc/sources.list"
fi
APTOPTS=(
  -o APT::Architecture=arm64 -o APT::Architectures::=arm64
  -o Dir::Etc::SourceList="$A/etc/sources.list" -o Dir::Etc::SourceParts="$A/etc/sources.list.d"
  -o Dir::Etc::Parts="$A/etc/apt.conf.d" -o Dir::Etc::PreferencesParts="$A/etc/preferences.d"
  -o Dir::State="$A" -o Dir::State::Lists="$A/lists" -o Dir::State::status="$A/status"
  -o Dir::Cache="$A" -o Dir::Cache::archives="$A/archives"
  -o Debug::NoLocking=1 -o APT::Install-Recommends=0
)
if [ ! -f "$ARM/root/.done" ]; then
  apt-get "${APTOPTS[@]}" update -q
  # empty status file => apt resolves the full dependency closure (libc6 etc.)
  apt-get "${APTOPTS[@]}" install -y -q --download-only \
      python3.11 libstdc++6 libgcc-s1 zlib1g libffi8 libssl3 libexpat1 ca-certificates
  rm -rf "$ARM/root"; mkdir -p "$ARM/root"
  for d in "$A"/archives/*.deb; do dpkg -x "$d" "$ARM/root"; done
  # merged-usr: make /lib/ld-linux-aarch64.so.1 resolvable inside the sysroot
  for l in lib bin sbin; do
    [ -e "$ARM/root/$l" ] || ln -s "usr/$l" "$ARM/root/$l"
  done
  touch "$ARM/root/.done"
fi

# ---- 3. aarch64 wheels -----------------------------------------------------
# host pip (python 3.11 on the host) installs aarch64 cp311 wheels into a plain target dir
PIPPLAT=(--only-binary=:all: --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64
         --platform manylinux_2_17_aarch64 --python-version 3.11 --implementation cp --abi cp311)
PKGS=("onnxruntime==$ORT_VERSION" numpy tokenizers click jinja2 pytest ${EXTRA_PKGS:-})
STAMP="${PKGS[*]}"
if [ "$(cat "$ARM/site/.done" 2>/dev/null)" != "$STAMP" ]; then
  rm -rf "$ARM/site"
  python3 -m pip install -q --disable-pip-version-check --target "$ARM/site" "${PIPPLAT[@]}" "${PKGS[@]}" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  echo "$STAMP" > "$ARM/site/.done"
fi

# ---- 4. binfmt_misc (optional; ARM_BINFMT=0 skips) -----------------------------
# Lets the kernel exec aarch64 ELFs directly, needed when emulated code runs
# subprocess.run([sys.executable, ...]). Kernel-global, affects only aarch64 ELFs.
if [ "${ARM_BINFMT:-1}" = 1 ]; then
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || echo "WARN: cannot mount binfmt_misc"
  fi
  if [ -e /proc/sys/fs/binfmt_misc/register ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register \
      || echo "WARN: cannot register the qemu-aarch64 binfmt handler"
  fi
fi

# ---- 5. wrappers ------------------------------------------------------------
cat > "$ARM/env.sh" <<ENV
# source me: environment for the emulated aarch64 python
export QEMU_LD_PREFIX=$ARM/root   # qemu sysroot (same as -L; inherited by binfmt-launched children)
export PYTHONPATH=\${PYTHONPATH:+\$PYTHONPATH:}$ARM/site
export CXX=aarch64-linux-gnu-g++  # host cross compiler; x86 binaries exec natively from emulated code
ENV
cat > "$ARM/py" <<PY
#!/bin/sh
# emulated aarch64 python 3.11 with the aarch64 site dir on the path
. $ARM/env.sh
exec qemu-aarch64 $ARM/root/usr/bin/python3.11 "\$@"
PY
chmod +x "$ARM/py"

# ---- 6. fake /proc/cpuinfo inside the sysroot ------------------------------------
# qemu 7.2 user-mode passes the HOST's x86 /proc/cpuinfo through. onnxruntime >= 1.28
# (pytorch cpuinfo) then segfaults at import, and code reading "Features" sees x86 flags.
# qemu resolves absolute paths inside the -L/QEMU_LD_PREFIX sysroot first, so
# $ARM/root/proc/cpuinfo shadows the host file. Features are generated from the emulated
# CPU's AT_HWCAP/AT_HWCAP2 (re-run setup.sh with QEMU_CPU=... to match another model);
# MIDR fields claim a Neoverse-N1.
mkdir -p "$ARM/root/proc"
"$ARM/py" - "$(nproc)" > "$ARM/root/proc/cpuinfo.new" <<'CPUINFO'
import ctypes, sys
h1n = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop "
       "sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg").split()
h2n = ("dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm svebf16 i8mm "
       "bf16 dgh rng bti mte ecv afp rpres mte3 sme sme_i16i64 sme_f64f64 sme_i8i32 sme_f16f32 sme_b16f32 sme_f32f32 "
       "sme_fa64 wfxt ebf16 sve_ebf16").split()
libc = ctypes.CDLL(None); libc.getauxval.restype = ctypes.c_ulong; libc.getauxval.argtypes = [ctypes.c_ulong]
h1, h2 = libc.getauxval(16), libc.getauxval(26)
feats = [n for i, n in enumerate(h1n) if h1 >> i & 1] + [n for i, n in enumerate(h2n) if h2 >> i & 1]
for p in range(int(sys.argv[1])):
    print(f"processor\t: {p}\nBogoMIPS\t: 50.00\nFeatures\t: {' '.join(feats)}\nCPU implementer\t: 0x41\n"
          f"CPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n")
CPUINFO
mv "$ARM/root/proc/cpuinfo.new" "$ARM/root/proc/cpuinfo"

# ---- 7. check ----------------------------------------------------------------
"$ARM/py" -c "import numpy, onnxruntime, tokenizers, click, jinja2, pytest, platform; print('OK', platform.machine(), 'ort', onnxruntime.__version__, 'numpy', numpy.__version__, 'tokenizers', tokenizers.__version__)"
