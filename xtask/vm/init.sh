#!/bin/sh
# /init of the guest that `cargo xtask vm-test` boots: runs ringsided with the sched_ext backend
# beside the labelled ML workload and CPU-bound noise, and prints what the host checks between
# "@@begin NAME" and "@@end NAME" lines on the serial console. Ends by powering the guest off.
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
. /etc/vm-test.env

section() { echo "@@begin $1"; cat "$2" 2>&1; echo; echo "@@end $1"; }
value() { echo "@@value $1=$2"; }
scx_state() { cat /sys/kernel/sched_ext/state 2>/dev/null || echo missing; }
scx_ops() { cat /sys/kernel/sched_ext/root/ops 2>/dev/null; }
URL=http://127.0.0.1:9650

start_daemon() { # backend, log
	ringsided --config /etc/ringside.toml --sched-backend "$1" --listen 127.0.0.1:9650 \
		--data-dir "/tmp/data-$1" --token-file /etc/token >"$2" 2>&1 &
	DAEMON=$!
	i=0
	until ringsided snapshot --url $URL --token-file /etc/token >/dev/null 2>&1; do
		i=$((i + 1)); [ $i -gt 600 ] && { echo "@@error ringsided ($1) did not answer"; return 1; }
		sleep 0.1
	done
}
stop_daemon() {
	kill -TERM "$DAEMON"; i=0
	while kill -0 "$DAEMON" 2>/dev/null; do
		i=$((i + 1)); [ $i -gt 300 ] && { echo "@@error ringsided did not stop"; kill -9 "$DAEMON"; }
		sleep 0.1
	done
	wait "$DAEMON"; value daemon_exit "$?"
}
start_noise() {
	NOISE=""
	for _ in $(seq "$NOISE_LOOPS"); do sh -c 'while :; do :; done' & NOISE="$NOISE $!"; done
}
stop_noise() { kill $NOISE 2>/dev/null; wait $NOISE 2>/dev/null; }
workload() { # name: the labelled workload beside noise, iteration statistics kept
	start_noise
	ml-workload --doubles /lib/doubles --phase-ms "$PHASE_MS" --cycles "$CYCLES" \
		--stats "/tmp/stats-$1.json" --log "/tmp/truth-$1.jsonl" >"/tmp/workload-$1.log" 2>&1
	value "workload_exit_$1" "$?"
	stop_noise
	section "stats-$1" "/tmp/stats-$1.json"
}

value kernel "$(uname -r)"
value cpus "$(nproc)"
value nodes "$(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
value scx_state_before "$(scx_state)"

# 1. The sched_ext backend: registered, carries the workload's decisions, unregisters at stop.
start_daemon scx /tmp/daemon-scx.log || { section daemon-scx /tmp/daemon-scx.log; reboot -f; }
value scx_state_running "$(scx_state)"
value scx_ops_running "$(scx_ops)"
workload scx
ringsided snapshot --url $URL --token-file /etc/token >/tmp/snapshot-scx.json 2>&1
section snapshot-scx /tmp/snapshot-scx.json
value scx_state_after_workload "$(scx_state)"
ml-workload --pingpong "$PINGPONG" >/tmp/pingpong-scx.json 2>&1
section pingpong-scx /tmp/pingpong-scx.json
stop_daemon
value scx_state_stopped "$(scx_state)"
value scx_ops_stopped "$(scx_ops)"
section daemon-scx /tmp/daemon-scx.log

# 2. Ejection: an operator's sysrq-S stops the scheduler; the daemon notices, alerts, falls back.
start_daemon scx /tmp/daemon-eject.log || { section daemon-eject /tmp/daemon-eject.log; reboot -f; }
value scx_state_second "$(scx_state)"
sleep 1
echo S >/proc/sysrq-trigger
sleep 2
value scx_state_ejected "$(scx_state)"
ringsided snapshot --url $URL --token-file /etc/token >/tmp/snapshot-eject.json 2>&1
section snapshot-eject /tmp/snapshot-eject.json
stop_daemon
section daemon-eject /tmp/daemon-eject.log

# 3. Baselines for the benchmark: setattr, and the kernel's own scheduler (daemon observing).
if [ "$BENCH" = 1 ]; then
	for backend in setattr observe; do
		start_daemon $backend "/tmp/daemon-$backend.log" || continue
		workload $backend
		ml-workload --pingpong "$PINGPONG" >"/tmp/pingpong-$backend.json" 2>&1
		section "pingpong-$backend" "/tmp/pingpong-$backend.json"
		stop_daemon
	done
fi
echo "@@done"
reboot -f
