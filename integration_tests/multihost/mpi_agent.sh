#!/bin/sh
# mpirun's remote-shell agent on the test hosts (mpirun --mca plm_rsh_agent): "mpi_agent.sh HOST COMMAND..." runs
# COMMAND on HOST as ssh would, in its network namespace with its hostname and /etc/hosts (from
# $STRATAGEM_TEST_HOSTS_DIR/HOST.hosts).
host=$1
shift
exec nsenter --net="/run/netns/$host" unshare --uts --mount --propagation private sh -c \
  'hostname "$0" && mount --bind "$STRATAGEM_TEST_HOSTS_DIR/$0.hosts" /etc/hosts && exec sh -c "$*"' "$host" "$@"
