#!/usr/bin/env bash
# Checks the CUDA backend on a GPU node: the CUDA tests, the daemon's kernels on CUDA end to
# end, then the GPU benchmark, and prints one table of the results and the figures.
#
#   scripts/gpu-check.sh bundle [DIR]   on a build machine: builds ringsided, the CUDA test
#                                       executables and the GPU benchmark (release), and copies
#                                       them, stripped, into DIR (default .gpu-bundle at the
#                                       repository root) with the shared libraries they need
#                                       beyond glibc, for a GPU node without a Rust toolchain
#   scripts/gpu-check.sh [run] [DIR]    on the GPU node: runs what DIR holds, or, without a
#                                       bundle there, builds it first with cargo
#
# Needs the NVIDIA driver (libcuda.so.1) and NVRTC (libnvrtc.so.13 or .12); both are looked for
# where CUDA installs and pip wheels put them. The NVRTC major version must not be newer than
# the driver's CUDA version (NVRTC 13 writes PTX that only a CUDA 13 driver loads).
# RINGSIDE_REQUIRE_CUDA is set, so a test that cannot use the device fails instead of skipping.
# Every step is bounded by `timeout`, the whole run by about six minutes; a failed step is
# recorded and the next one still runs. With $OUT set, the log and the summary go there.
set -uo pipefail
# Step times are read from $EPOCHREALTIME, whose decimal point follows the locale.
export LC_NUMERIC=C

root=$(cd "$(dirname "$0")/.." && pwd)

# The whole run, in seconds; each step gets its own limit, cut to what is left of this.
RUN_BUDGET=${RINGSIDE_GPU_CHECK_BUDGET_S:-360}
# The bundle must travel with the working tree, which may carry 64 MiB in all.
BUNDLE_LIMIT_MIB=56
# Executables of a bundle, by their name in it.
BUNDLED=(ringsided kernels-cuda kernels-lib daemon-lib tests-gpu bench-gpu)

die() {
    echo "gpu-check: $*" >&2
    exit 1
}

# An absolute path for DIR, relative to where the script was called from.
absolute() {
    case $1 in
        /*) echo "$1" ;;
        *) echo "$PWD/$1" ;;
    esac
}

# --- building ------------------------------------------------------------------------------

# Executable paths of `cargo <args> --message-format=json`, one "kind name path" a line.
cargo_executables() {
    local json
    json=$(cargo "$@" --message-format=json) || return 1
    if command -v jq >/dev/null; then
        jq -r 'select(.reason == "compiler-artifact" and .executable != null)
               | "\(.target.kind[0]) \(.target.name) \(.executable)"' <<<"$json"
    else
        python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["kind"][0], m["target"]["name"], m["executable"])
' <<<"$json"
    fi
}

# The one executable of kind $1 named $2 in the listing on stdin.
pick() {
    awk -v kind="$1" -v name="$2" '$1 == kind && $2 == name { print $3; exit }'
}

# Builds everything in release and sets exe_<name> to each executable's path in target/.
build_all() {
    local listing
    # The daemon embeds the console. The checks do not use it, so a console that does not
    # build now need not stop them where an earlier build of it is there to embed.
    if (cd "$root" && cargo xtask console); then
        console="built now"
    elif [[ -f $root/frontend/dist/index.html ]]; then
        console="an earlier build: cargo xtask console failed"
        echo "gpu-check: cargo xtask console failed; ringsided embeds the console built before" >&2
    else
        die "cargo xtask console failed, and there is no earlier build of the console to embed"
    fi
    (cd "$root" && cargo build --release -j2 -p ringside-daemon) || die "building ringsided failed"
    exe_ringsided="$root/target/release/ringsided"

    listing=$(cd "$root" && cargo_executables test --release -j2 --no-run -p ringside-kernels --lib --test cuda) ||
        die "building the kernels' tests failed"
    exe_kernels_cuda=$(pick test cuda <<<"$listing")
    exe_kernels_lib=$(pick lib ringside_kernels <<<"$listing")
    listing=$(cd "$root" && cargo_executables test --release -j2 --no-run -p ringside-daemon --lib) ||
        die "building the daemon's tests failed"
    exe_daemon_lib=$(pick lib ringside_daemon <<<"$listing")
    listing=$(cd "$root" && cargo_executables test --release -j2 --no-run -p ringside-tests --test gpu) ||
        die "building the end-to-end GPU test failed"
    exe_tests_gpu=$(pick test gpu <<<"$listing")
    listing=$(cd "$root" && cargo_executables bench -j2 --no-run -p ringside-kernels --bench gpu) ||
        die "building the GPU benchmark failed"
    exe_bench_gpu=$(pick bench gpu <<<"$listing")

    local name var
    for name in "${BUNDLED[@]}"; do
        var="exe_${name//-/_}"
        [[ -n ${!var:-} && -x ${!var} ]] || die "no executable found for $name"
    done
}

# Shared libraries a binary needs that a GPU node's image may lack: all but the C library's
# own, which any glibc as new as the build machine's provides.
extra_libraries() {
    ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|libgcc_s|ld-linux[^/]*)\.so[^/]*$' || true
}

bundle() {
    local dir=$1 name var lib bytes
    build_all
    rm -rf "$dir"
    mkdir -p "$dir/lib" || die "cannot create $dir"
    for name in "${BUNDLED[@]}"; do
        var="exe_${name//-/_}"
        cp "${!var}" "$dir/$name" || die "cannot copy ${!var}"
        strip "$dir/$name" || die "cannot strip $dir/$name"
    done
    for name in "${BUNDLED[@]}"; do
        while read -r lib; do
            [[ -e "$dir/lib/$(basename "$lib")" ]] || cp -L "$lib" "$dir/lib/" || die "cannot copy $lib"
        done < <(extra_libraries "$dir/$name")
    done
    {
        echo "ringside GPU check bundle"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(ldd --version | head -n 1)"
        echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
        echo "uncommitted changes: $(git -C "$root" status --porcelain 2>/dev/null | wc -l) files"
        echo "console: $console"
        echo "files:"
        (cd "$dir" && find . -type f ! -name MANIFEST -printf '%P %s\n' | sort)
    } >"$dir/MANIFEST"
    bytes=$(du -sb "$dir" | cut -f1)
    cat "$dir/MANIFEST"
    echo "bundle: $dir, $((bytes / 1024)) KiB ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB)"
    if ((bytes > BUNDLE_LIMIT_MIB * 1024 * 1024)); then
        die "the bundle exceeds ${BUNDLE_LIMIT_MIB} MiB, more than can travel with the working tree"
    fi
}

# --- running -------------------------------------------------------------------------------

# Where a library is: the loader's cache first, then where CUDA and pip put it.
find_library() {
    local name=$1 dir found
    found=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }')
    if [[ -n $found ]]; then
        echo "$found"
        return 0
    fi
    for dir in "${library_dirs[@]}"; do
        for found in "$dir/$name" "$dir/$name".*; do
            if [[ -e $found ]]; then
                echo "$found"
                return 0
            fi
        done
    done
    return 1
}

# Puts the directories of libcuda and NVRTC (and the bundle's libraries) on LD_LIBRARY_PATH.
find_cuda_libraries() {
    local dir site lib path
    library_dirs=()
    for dir in /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
        /usr/lib/x86_64-linux-gnu; do
        [[ -d $dir ]] && library_dirs+=("$dir")
    done
    if command -v python3 >/dev/null; then
        while read -r site; do
            for dir in "$site/nvidia/cu13/lib" "$site/nvidia/cuda_nvrtc/lib"; do
                [[ -d $dir ]] && library_dirs+=("$dir")
            done
        done < <(timeout 20 python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
    fi
    local prepend=()
    [[ -d $bundle_dir/lib ]] && prepend+=("$bundle_dir/lib")
    for lib in libcuda.so.1 libnvrtc.so.13 libnvrtc.so.12; do
        if path=$(find_library "$lib"); then
            echo "$lib: $path"
            dir=$(dirname "$(readlink -f "$path")")
            [[ $dir == /usr/lib/x86_64-linux-gnu || $dir == /lib/x86_64-linux-gnu ]] || prepend+=("$dir")
        else
            echo "$lib: not found"
        fi
    done
    if ((${#prepend[@]})); then
        local joined
        joined=$(printf '%s:' "${prepend[@]}")
        export LD_LIBRARY_PATH="${joined%:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
}

# Compares the daemon's GPU telemetry with what nvidia-smi says of the same device: starts the
# daemon with its GPU source and a CUDA canary, reads /api/snapshot and /metrics, and fails
# where a field disagrees beyond its tolerance or is null without a reason
# (scripts/gpu_telemetry_check.py). The snapshot it read is kept in $OUT.
gpu_telemetry_check() {
    local daemon=$1 keep=()
    [[ -n ${OUT:-} ]] && keep=(--snapshot-out "$OUT/gpu-snapshot.json")
    python3 "$GPU_CHECK_ROOT/scripts/gpu_telemetry_check.py" "$daemon" "${keep[@]}"
}

steps=()
results=()
seconds=()
failures=0
started_at=$SECONDS

# Runs one step within `limit` seconds (less if the run's budget is nearly spent), records its
# result from the test harness's summary lines and any `skipped:` lines, and keeps its output.
step() {
    local name=$1 limit=$2 status passed failed skipped counts result left began took
    shift 2
    left=$((RUN_BUDGET - (SECONDS - started_at)))
    ((limit > left)) && limit=$left
    echo
    local output="$work/step-${#steps[@]}.log"
    began=$EPOCHREALTIME
    if ((limit < 5)); then
        echo "== $name: not run, the run's ${RUN_BUDGET} s are spent" | tee "$output"
        status=125
    else
        echo "== $name (at most ${limit} s)"
        # A shell function of this script runs in a bash of its own, which timeout can start.
        if declare -F "$1" >/dev/null; then
            set -- bash -c "$(declare -f "$1"); \"\$@\"" "$1" "$@"
        fi
        # timeout signals the step's whole process group, so a daemon a test started goes too.
        timeout -k 10 "$limit" "$@" 2>&1 | tee "$output"
        status=${PIPESTATUS[0]}
    fi
    took=$(awk -v a="$began" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    passed=$(grep -Eo '^test result: .*' "$output" | grep -Eo '[0-9]+ passed' | awk '{ s += $1 } END { print s + 0 }')
    failed=$(grep -Eo '^test result: .*' "$output" | grep -Eo '[0-9]+ failed' | awk '{ s += $1 } END { print s + 0 }')
    # A skip is said on a line of its own, or after the test's name where output is not
    # captured. `skipped: a GPU is here` is the no-GPU test standing aside where there is one:
    # not a skip of anything the GPU should run.
    skipped=$(grep -Eo '(^|\.\.\. )skipped: .*' "$output" | grep -cv 'skipped: a GPU is here')
    counts=""
    if grep -q '^test result: ' "$output" || ((skipped > 0)); then
        counts=": passed $passed / failed $failed / skipped $skipped"
    fi
    if ((status == 124 || status == 137)); then
        result="FAILED (timed out after ${limit} s)$counts"
    elif ((status == 125)); then
        result="FAILED (not run, no time left)"
    elif ((status != 0)); then
        result="FAILED (exit $status)$counts"
    elif ((skipped > 0)); then
        result="FAILED (skipped where a GPU is required)$counts"
        status=1
    else
        result="ok$counts"
    fi
    if grep -q '^gpu-telemetry: ' "$output"; then
        result="$result; $(grep -m1 '^gpu-telemetry: ' "$output")"
    fi
    ((status != 0)) && failures=$((failures + 1))
    steps+=("$name")
    results+=("$result")
    seconds+=("$took")
}

run() {
    bundle_dir=$1
    local log summary
    if [[ -n ${OUT:-} ]]; then
        mkdir -p "$OUT"
        log="$OUT/gpu-check.log"
        summary="$OUT/gpu-check-summary.md"
    else
        log=$(mktemp -t gpu-check-XXXXXX.log)
        summary=$(mktemp -t gpu-check-summary-XXXXXX.md)
    fi
    work=$(mktemp -d -t gpu-check-XXXXXX)
    # Everything from here on goes to the log as well.
    exec > >(tee "$log") 2>&1
    local tee_pid=$!

    echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n); log: $log"
    if [[ -f $bundle_dir/MANIFEST && -e $bundle_dir/ringsided ]]; then
        echo "== bundle $bundle_dir"
        cat "$bundle_dir/MANIFEST"
        local name
        for name in "${BUNDLED[@]}"; do
            [[ -x $bundle_dir/$name ]] || chmod u+x "$bundle_dir/$name" 2>/dev/null
            local var="exe_${name//-/_}"
            printf -v "$var" '%s' "$bundle_dir/$name"
        done
    elif command -v cargo >/dev/null; then
        echo "== no bundle in $bundle_dir: building with cargo"
        build_all
        # The run's budget is for the checks, not the build.
        started_at=$SECONDS
    else
        echo "gpu-check: no bundle in $bundle_dir and no cargo to build one" >&2
        exec >&- 2>&-
        wait "$tee_pid"
        exit 2
    fi

    echo
    echo "== libraries"
    find_cuda_libraries
    local missing
    missing=$(for name in "${BUNDLED[@]}"; do
        var="exe_${name//-/_}"
        ldd "${!var}" 2>/dev/null | grep 'not found' | sed "s|^|$name: |"
    done)
    [[ -n $missing ]] && echo "missing shared libraries:" && echo "$missing"

    echo
    echo "== device"
    export RINGSIDE_REQUIRE_CUDA=1
    export RINGSIDED_BIN=$exe_ringsided
    export GPU_CHECK_ROOT=$root
    if command -v nvidia-smi >/dev/null; then
        timeout 30 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader ||
            echo "nvidia-smi --query-gpu failed"
        timeout 30 nvidia-smi | head -n 12 || true
    else
        echo "nvidia-smi not found"
    fi

    # One test at a time, so each has the device to itself.
    step "kernels: CUDA tests" 100 "$exe_kernels_cuda" --test-threads=1 --nocapture
    step "kernels: CUDA unit tests (NVRTC, launch)" 40 "$exe_kernels_lib" cuda --test-threads=1 --nocapture
    step "daemon: CUDA canary" 40 "$exe_daemon_lib" cuda_asked_for --test-threads=1 --nocapture
    step "end to end: ringsided's kernels on CUDA" 60 "$exe_tests_gpu" --test-threads=1 --nocapture
    step "GPU benchmark" 100 "$exe_bench_gpu" --bench
    step "GPU telemetry vs nvidia-smi" 60 gpu_telemetry_check "$exe_ringsided"
    step "daemon: NVML GPU source" 40 "$exe_daemon_lib" gpu:: --test-threads=1 --nocapture

    {
        echo
        echo "| step | result | seconds |"
        echo "|---|---|---|"
        local i
        for i in "${!steps[@]}"; do
            echo "| ${steps[$i]} | ${results[$i]} | ${seconds[$i]} |"
        done
        echo
        echo "Figures:"
        echo
        # The benchmark's table and ratios, then what the tests measured on the way.
        local figures
        # Without captured output a test's first line follows its name: that is cut off.
        figures=$(
            grep -hE '^(\||GPU round trips|[0-9]+ round trips|[A-Za-z, 0-9]+: launch /)' "$work/step-4.log"
            sed -nE 's/^(test .* \.\.\. )?((device: |echo round trip|device-measured latency|gpu-[a-z]+ \().*)$/\2/p' \
                "$work/step-0.log" "$work/step-3.log" | awk '!seen[$0]++'
        ) 2>/dev/null
        echo "${figures:-(none: nothing ran on a GPU)}"
        echo
        if ((failures > 0)); then
            echo "gpu-check: $failures of ${#steps[@]} steps failed ($((SECONDS - started_at)) s; log: $log)"
        else
            echo "gpu-check: all ${#steps[@]} steps passed ($((SECONDS - started_at)) s; log: $log)"
        fi
    } | tee "$summary"

    rm -rf "$work"
    # Let the log catch up before the exit status is known.
    exec >&- 2>&-
    wait "$tee_pid"
    ((failures == 0))
}

mode=run
case ${1:-} in
    bundle | run)
        mode=$1
        shift
        ;;
    -h | --help)
        sed -n '2,18p' "$0"
        exit 0
        ;;
esac
dir=$(absolute "${1:-$root/.gpu-bundle}")

case $mode in
    bundle) bundle "$dir" ;;
    run) run "$dir" ;;
esac
