#!/bin/sh
# runc, minus the capabilities this machine cannot grant (installed by e2e/kind/host.sh only
# where a privileged container fails). Docker gives privileged containers every capability; in
# a sandbox whose bounding set lacks one (CAP_SYS_RESOURCE, say) runc then fails with "unable to
# apply caps". This drops what is outside the bounding set from the bundle's config.json
# (create, run) and from the process spec of `runc exec --process FILE`, then runs runc.
real=@REAL_RUNC@
allowed='@ALLOWED@'

filter() { # $1: JSON file, $2: jq path of its capabilities object
  [ -f "$1" ] || return 0
  jq --argjson ok "$allowed" \
    "if $2 then $2 |= with_entries(.value |= (if type == \"array\" then map(select(. as \$c | \$ok | index(\$c))) else . end)) else . end" \
    "$1" >"$1.ec2tl" && mv "$1.ec2tl" "$1"
}

cmd="" bundle="" process="" prev=""
for arg in "$@"; do
  case "$prev" in
    --bundle | -b) bundle=$arg ;;
    --process | -p) process=$arg ;;
  esac
  case "$arg" in
    --bundle=*) bundle=${arg#--bundle=} ;;
    --process=*) process=${arg#--process=} ;;
    create | run | exec) [ -z "$cmd" ] && cmd=$arg ;;
  esac
  prev=$arg
done

case "$cmd" in
  create | run) filter "${bundle:-.}/config.json" .process.capabilities ;;
  exec) [ -n "$process" ] && filter "$process" .capabilities ;;
esac
exec "$real" "$@"
