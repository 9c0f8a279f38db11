#!/usr/bin/env bash
# A private one-machine Slurm cluster for tests and trials of profiles/slurm (docs/workflow.md).
#
#   scripts/slurm_cluster.sh install   install slurm-wlm + munge if missing (root, apt), nothing else
#   scripts/slurm_cluster.sh start     install them if missing, start the daemons
#   scripts/slurm_cluster.sh status    the daemons, sinfo and squeue; exit 1 when not running
#   scripts/slurm_cluster.sh env       print `export SLURM_CONF=... PATH=...` (eval it to use the cluster)
#   scripts/slurm_cluster.sh stop      cancel its jobs, stop exactly the daemons it started, remove its folder
#
# Everything lives in $MINBERT_SLURM_DIR (default: ${TMPDIR:-/tmp}/minbert-slurm): slurm.conf,
# gres.conf, the munge key and socket, state, logs and pid files. Nothing is written to /etc and no
# system service is touched. The client commands find the cluster through SLURM_CONF, or through
# the wrappers in $MINBERT_SLURM_DIR/bin that set it (`eval "$(scripts/slurm_cluster.sh env)"` does both).
#
# The cluster: one node named after `hostname -s` with this machine's CPUs and memory and one
# emulated GPU (a count-only gres; SlurmdParameters=config_overrides makes slurmd take the node's
# description from slurm.conf instead of probing the hardware), in partition `gpu` (the default).
# When a second slurmd can run on the machine, a node `<host>-cpu` without GPU forms partition
# `cpu`. No accounting (accounting_storage/none: `sacct` fails, as on clusters without slurmdbd);
# MinJobAge=3600 keeps finished jobs visible to squeue and `scontrol show job`; proctrack/linuxproc
# and task/none, which need no cgroups or systemd.
#
# Settings (environment): MINBERT_SLURM_DIR; SLURM_NODE_CPUS (default: nproc); SLURM_NODE_MEM_MB
# (default: this machine's memory; more is allowed, as the node description is not checked);
# SLURM_NODE_GPUS (default 1); SLURM_CPU_NODE (1: try to add the GPU-less node, the default; 0: not).
#
# Exit codes: 0 done; 1 `status`: not running; 2 usage; 3 Slurm/munge missing and not installable
# (not root, no apt-get, or the install failed); 4 the daemons did not start (see the logs printed).
set -uo pipefail

STATE=${MINBERT_SLURM_DIR:-${TMPDIR:-/tmp}/minbert-slurm}
CONF=$STATE/slurm.conf
HOST=$(hostname -s 2>/dev/null || echo localhost)
HOST=${HOST:-localhost}
CPU_NODE=$HOST-cpu
NEEDED=(munged slurmctld slurmd sbatch squeue sinfo scontrol scancel)

say() { echo "slurm_cluster: $*" >&2; }

missing_tools() {
  local t out=()
  for t in "${NEEDED[@]}"; do
    command -v "$t" >/dev/null 2>&1 || [ -x "/usr/sbin/$t" ] || out+=("$t")
  done
  echo "${out[*]:-}"
}

install_slurm() {
  local missing
  missing=$(missing_tools)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    say "cannot install slurm-wlm and munge (missing: $missing): not root"; exit 3
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    say "cannot install slurm-wlm and munge (missing: $missing): no apt-get on this machine"; exit 3
  fi
  say "installing slurm-wlm and munge with apt-get (missing: $missing)"
  local log=${TMPDIR:-/tmp}/minbert-slurm-apt.log
  export DEBIAN_FRONTEND=noninteractive
  # Services are not started by us; where policy-rc.d or systemd start the packaged ones, they
  # use /etc/slurm (absent) and the system munge socket, and never meet this cluster.
  if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >"$log" 2>&1; then
    if ! { apt-get update -q >>"$log" 2>&1 &&
           apt-get install -y -q --no-install-recommends slurm-wlm munge >>"$log" 2>&1; }; then
      say "cannot install slurm-wlm and munge: apt-get failed (log: $log): $(tail -n 1 "$log")"; exit 3
    fi
  fi
  missing=$(missing_tools)
  if [ -n "$missing" ]; then
    say "cannot install slurm-wlm and munge: still missing after apt-get: $missing"; exit 3
  fi
}

export PATH=$PATH:/usr/sbin:/sbin

alive() {   # alive PIDFILE NAME: the pid file names a live process running NAME
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$2"
}

free_ports() {   # three distinct free TCP ports
  python3 -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))'
}

mem_mb() {
  awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo
}

write_config() {
  local cpus=${SLURM_NODE_CPUS:-$(nproc)} mem=${SLURM_NODE_MEM_MB:-$(mem_mb)} gpus=${SLURM_NODE_GPUS:-1}
  local ctld_port d_port d2_port gres_node="" gres_conf=""
  read -r ctld_port d_port d2_port < <(free_ports)
  if [ "$gpus" -gt 0 ]; then
    gres_node=" Gres=gpu:$gpus"
    gres_conf="NodeName=$HOST Name=gpu File=/dev/null Count=$gpus"
  fi
  cat >"$CONF" <<EOF
# Written by scripts/slurm_cluster.sh: a private test cluster (no accounting, no cgroups).
ClusterName=minbert
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=2
MinJobAge=3600
EnforcePartLimits=ALL
KillWait=5
InactiveLimit=0
SlurmdTimeout=120
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName=$HOST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$d_port CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem$gres_node State=UNKNOWN
PartitionName=gpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
  if [ "${SLURM_CPU_NODE:-1}" = 1 ]; then
    cat >>"$CONF" <<EOF
NodeName=$CPU_NODE NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$d2_port CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=$CPU_NODE Default=NO MaxTime=INFINITE State=UP
EOF
  fi
  echo "$gres_conf" >"$STATE/gres.conf"
  # Client commands that find this cluster without SLURM_CONF: the slurm-jobstep executor clears
  # every SLURM_* variable before its `srun` inside a job, and a real cluster's srun reads
  # /etc/slurm. `export PATH=$STATE/bin:$PATH` (see `env`) puts these first.
  local t real
  mkdir -p "$STATE/bin"
  for t in sbatch srun squeue sinfo scontrol scancel sacct sacctmgr sshare; do
    real=$(type -ap "$t" | grep -v "^$STATE/" | head -n 1)
    [ -n "$real" ] || continue
    printf '#!/bin/sh\nSLURM_CONF=%s exec %s "$@"\n' "$CONF" "$real" >"$STATE/bin/$t"
    chmod 755 "$STATE/bin/$t"
  done
}

env_lines() { echo "export SLURM_CONF=$CONF PATH=$STATE/bin:\$PATH"; }

nodes() { awk -F'[ =]' '/^NodeName=/ {print $2}' "$CONF"; }

print_logs() {
  local f
  for f in "$STATE"/log/*.log; do
    [ -f "$f" ] && { echo "--- $f (last lines)" >&2; tail -n 15 "$f" >&2; }
  done
}

stop_pid() {   # stop_pid PIDFILE NAME: TERM, then KILL after 10 s; only when the pid runs NAME
  local pid i
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 50); do alive "$1" "$2" || break; sleep 0.2; done
  alive "$1" "$2" && kill -KILL "$pid" 2>/dev/null
  rm -f "$1"
}

node_states() { SLURM_CONF=$CONF sinfo -h -N -o '%N %t' 2>/dev/null; }

cmd_stop() {
  [ -d "$STATE" ] || { say "nothing to stop ($STATE does not exist)"; return 0; }
  if [ -f "$CONF" ] && alive "$STATE/slurmctld.pid" slurmctld; then
    local jobs i
    jobs=$(SLURM_CONF=$CONF squeue -h -t PD,R,CG -o %i 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// }" ]; then
      SLURM_CONF=$CONF scancel $jobs 2>/dev/null
      for i in $(seq 50); do
        [ -z "$(SLURM_CONF=$CONF squeue -h -t PD,R,CG -o %i 2>/dev/null)" ] && break; sleep 0.2
      done
    fi
  fi
  local n
  for n in $( [ -f "$CONF" ] && nodes ); do stop_pid "$STATE/slurmd-$n.pid" slurmd; done
  stop_pid "$STATE/slurmctld.pid" slurmctld
  stop_pid "$STATE/munge/munged.pid" munged
  if [ "${MINBERT_SLURM_KEEP:-0}" = 1 ]; then
    say "stopped; kept $STATE"
  else
    rm -rf "$STATE"; say "stopped; removed $STATE"
  fi
}

cmd_status() {
  local ok=0 n
  if [ ! -f "$CONF" ]; then echo "not running (no $CONF)"; return 1; fi
  alive "$STATE/munge/munged.pid" munged && echo "munged    pid $(cat "$STATE/munge/munged.pid")" || { echo "munged    not running"; ok=1; }
  alive "$STATE/slurmctld.pid" slurmctld && echo "slurmctld pid $(cat "$STATE/slurmctld.pid")" || { echo "slurmctld not running"; ok=1; }
  for n in $(nodes); do
    alive "$STATE/slurmd-$n.pid" slurmd && echo "slurmd    pid $(cat "$STATE/slurmd-$n.pid") ($n)" || { echo "slurmd    not running ($n)"; ok=1; }
  done
  env_lines
  SLURM_CONF=$CONF sinfo 2>&1
  SLURM_CONF=$CONF squeue 2>&1
  return $ok
}

cmd_start() {
  install_slurm
  if [ -f "$CONF" ] && alive "$STATE/slurmctld.pid" slurmctld; then
    say "already running ($STATE)"; env_lines; return 0
  fi
  [ -d "$STATE" ] && cmd_stop >/dev/null 2>&1   # leftovers of a crashed run
  mkdir -p "$STATE"/{munge,ctld,spool,log}
  chmod 755 "$STATE" "$STATE/munge"   # munge wants its socket folder searchable
  write_config

  # munge: a private key and socket; --force lets it run as root
  dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$STATE/munge/munge.key"
  munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
    --seed-file="$STATE/munge/munged.seed" >>"$STATE/log/start.log" 2>&1 ||
    { say "munged did not start"; print_logs; cmd_stop >/dev/null 2>&1; exit 4; }

  export SLURM_CONF=$CONF
  slurmctld -c >>"$STATE/log/start.log" 2>&1 ||
    { say "slurmctld did not start"; print_logs; cmd_stop >/dev/null 2>&1; exit 4; }
  local n
  for n in $(nodes); do
    mkdir -p "$STATE/spool/$n"
    if ! slurmd -N "$n" >>"$STATE/log/start.log" 2>&1; then
      [ "$n" = "$CPU_NODE" ] && continue   # a second slurmd per machine is optional (see below)
      say "slurmd ($n) did not start"; print_logs; cmd_stop >/dev/null 2>&1; exit 4
    fi
  done

  # wait until the GPU node is idle; the GPU-less node is optional
  local i states main="" cpu=""
  for i in $(seq 120); do
    states=$(node_states)
    main=$(echo "$states" | awk -v n="$HOST" '$1 == n {print $2}')
    cpu=$(echo "$states" | awk -v n="$CPU_NODE" '$1 == n {print $2}')
    [[ "$main" =~ ^(inval|drain|drng|fail) ]] && break
    if [ "$main" = idle ]; then
      { [ -z "$cpu" ] || [ "$cpu" = idle ] || [[ "$cpu" =~ ^(inval|drain|drng|fail) ]] ||
        ! alive "$STATE/slurmd-$CPU_NODE.pid" slurmd; } && break
    fi
    sleep 0.5
  done
  if [ "$main" = idle ]; then
    if [ -n "$cpu" ] && [ "$cpu" != idle ]; then
      say "the GPU-less node $CPU_NODE is $cpu; going on without partition cpu"
      stop_pid "$STATE/slurmd-$CPU_NODE.pid" slurmd
      scontrol update nodename="$CPU_NODE" state=down reason="not started" >/dev/null 2>&1
    fi
    say "running: $(node_states | tr '\n' ' ')($STATE)"
    env_lines
    return 0
  fi
  say "node $HOST did not become idle: $(echo "$states" | tr '\n' ' ')"
  print_logs; cmd_stop >/dev/null 2>&1; exit 4
}

case "${1:-}" in
  install) install_slurm ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) env_lines ;;
  *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac
