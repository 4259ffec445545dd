#!/usr/bin/env bash
# A real-window smoke test: starts the debug binary under Xvfb, waits for its first frame,
# takes a screenshot, checks the window is not blank and the process is alive, then closes
# it with Ctrl+Q and checks it exits 0. Catches start-up regressions kittest cannot see
# (window creation, wgpu surface, fonts, persistence). Needs Xvfb, xwd, xwininfo, xdotool
# and python3 (`.ci/run` installs them); skipped with a message when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${VRAMLAB_BIN:-target/debug/vramlab}
for tool in Xvfb xwd xwininfo xdotool python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "smoke-window: SKIPPED ($tool not installed)" >&2
        exit 0
    fi
done
[ -x "$bin" ] || cargo build --locked --bin vramlab

work=$(mktemp -d)
chmod 700 "$work"
display=:$((90 + RANDOM % 9))
Xvfb "$display" -screen 0 1400x900x24 -nolisten tcp >"$work/xvfb.log" 2>&1 &
xvfb=$!
app=""
cleanup() {
    [ -n "$app" ] && kill "$app" 2>/dev/null || true
    kill "$xvfb" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
export DISPLAY=$display
# A private runtime dir (Wayland/Mesa warn "XDG_RUNTIME_DIR is invalid" without one) and
# config dir (the app persists its state there).
export XDG_RUNTIME_DIR=$work XDG_CONFIG_HOME=$work/config XDG_DATA_HOME=$work/data
for _ in $(seq 50); do xwininfo -root >/dev/null 2>&1 && break; sleep 0.1; done

"$bin" >"$work/app.log" 2>&1 &
app=$!

# Not blank: the screenshot has many distinct colours (an empty X root or an unpainted
# window has one or two).
colours() {
    python3 - "$1" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
header_size, = struct.unpack(">I", data[:4])
ncolors, = struct.unpack(">I", data[76:80])
pixels = data[header_size + 12 * ncolors:]
print(len({pixels[i:i + 4] for i in range(0, len(pixels) - 3, 4)}))
PY
}
shot=$work/shot.xwd
n=0
for _ in $(seq 120); do
    if ! kill -0 "$app" 2>/dev/null; then
        echo "smoke-window: FAILED: vramlab exited during start-up" >&2
        cat "$work/app.log" >&2
        exit 1
    fi
    if xwininfo -root -tree 2>/dev/null | grep -q '"vramlab'; then
        xwd -root -silent >"$shot"
        n=$(colours "$shot")
        [ "$n" -ge 64 ] && break
    fi
    sleep 0.5
done
if [ "$n" -lt 64 ]; then
    echo "smoke-window: FAILED: no painted vramlab window within 60 s ($n colours)" >&2
    xwininfo -root -tree >&2 || true
    cat "$work/app.log" >&2
    exit 1
fi
sleep 1
kill -0 "$app" || { echo "smoke-window: FAILED: vramlab died after its first frame" >&2; exit 1; }
[ -n "${SMOKE_SCREENSHOT:-}" ] && cp "$shot" "$SMOKE_SCREENSHOT"

win=$(xdotool search --name '^vramlab' | head -1)
xdotool windowfocus --sync "$win" 2>/dev/null || true
xdotool key --window "$win" ctrl+q
status=0
for _ in $(seq 40); do kill -0 "$app" 2>/dev/null || break; sleep 0.25; done
if kill -0 "$app" 2>/dev/null; then
    echo "smoke-window: FAILED: vramlab did not close on Ctrl+Q" >&2
    exit 1
fi
wait "$app" || status=$?
app=""
if [ "$status" != 0 ]; then
    echo "smoke-window: FAILED: vramlab exited with $status on close" >&2
    cat "$work/app.log" >&2
    exit 1
fi
echo "smoke-window: ok (first frame with $n colours, closed cleanly)"
