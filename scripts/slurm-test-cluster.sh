#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the Slurm engine's tests (and CI): munged,
# slurmctld and slurmd from Debian's slurm-wlm and munge packages, run as root, talking over
# the loopback address. Idempotent: a cluster that is up is left as it is. Prints one line and
# exits 0 when `sinfo` shows the node idle; exits 1 with the reason otherwise (the tests then
# skip, naming it).
#
#   bash scripts/slurm-test-cluster.sh            # start (or check) the cluster
#   INSTALL=1 bash scripts/slurm-test-cluster.sh  # apt-get install the packages first (CI)
#
# MaxArraySize is 4 (PACKTOOL_SLURM_MAX_ARRAY), so a run of more than four partitions needs
# several arrays, as a large run does on a real cluster. The scheduler parameters start a task
# as soon as a core is free (a real cluster's scheduler is what it is; docs/scale-out.md).
set -euo pipefail
fail() { echo "slurm test cluster: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (slurmd runs tasks as their user)"
if [ "${INSTALL:-0}" = 1 ] && ! command -v slurmctld >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 \
    || { timeout 300 apt-get update -q >/dev/null 2>&1 \
         && timeout 300 apt-get install -y -q slurm-wlm munge >/dev/null 2>&1; } \
    || fail "apt-get install slurm-wlm munge failed"
fi
for cmd in munged slurmctld slurmd sbatch sinfo; do
  command -v "$cmd" >/dev/null || fail "no $cmd (apt-get install slurm-wlm munge)"
done
if sinfo -h -o %T 2>/dev/null | grep -qE "^(idle|mixed|allocated)"; then
  echo "slurm test cluster: up ($(sinfo -h -o '%P %D %T'))"; exit 0
fi
HOST=$(hostname -s)
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
STATE=/var/spool/packtool-slurm-test
mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge "$STATE/ctld" "$STATE/d" /var/log/slurm /etc/slurm
rm -f "$STATE/ctld/clustername"  # a test cluster keeps no state worth a name check
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=packtool-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0,sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MaxArraySize=${PACKTOOL_SLURM_MAX_ARRAY:-4}
JobRequeue=1
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=2
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
pgrep -x slurmctld >/dev/null && scontrol reconfigure >/dev/null 2>&1 || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 1 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE "^(idle|mixed|allocated)"; then
    echo "slurm test cluster: up ($(sinfo -h -o '%P %D %T'))"; exit 0
  fi
  sleep 0.5
done
tail -3 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
fail "slurmctld/slurmd did not bring the node up"
