#!/bin/sh
# Open MPI's rsh agent for the two-namespace test (plm_rsh_agent): runs
# "HOST COMMAND..." in HOST's network namespace, under a host name of its
# own (so the ranks there count as another host). NETNS_HOSTS maps hosts to
# namespaces: "10.77.1.1=tn0-ab12 10.77.1.2=tn1-ab12".
host="$1"
shift
ns=""
for pair in $NETNS_HOSTS; do
  if [ "${pair%%=*}" = "$host" ]; then ns="${pair#*=}"; fi
done
if [ -z "$ns" ]; then
  echo "netns_rsh: unknown host $host (NETNS_HOSTS: $NETNS_HOSTS)" >&2
  exit 1
fi
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && $*"
