# Sourced by ci/test.sh before anything else: run the whole suite in a
# private mount namespace whose /proc/kallsyms holds only the kernel's
# lines that libfabric looks for.
#
# Why: libfabric's verbs provider (built into Debian's library) reads
# /proc/kallsyms to its end in every process's first fi_getinfo, looking
# for two symbols: twice in 1.17 (`vrb_set_peer_mem_support`,
# `vrb_set_dmabuf_support` in prov/verbs/src/fi_verbs.c), once in 2.1
# (`vrb_os_mem_support`, prov/verbs/include/linux/verbs_osd.h).
# FI_PROVIDER does not stop it. That is about 0.1 s of system time in each of the suite's
# thousands of processes: the tools' tests spent 4 min 19 s of system time
# with the whole file and 2 min 47 s with the cut, and ran in 266 s
# against 204 s (docs/decisions.md, "libfabric's start-up in the tests").
#
# What libfabric finds is unchanged: the lines kept are the kernel's own,
# those with either symbol in them (none on this kernel), so it decides
# what it would have decided. Nothing else the suite runs reads the file.
# The start-up benchmark (ci/bench/startup.sh) is not run here, and
# measures the whole file.
#
# Needs root and unshare(1); otherwise, or with FABRIC_MSG_FULL_KALLSYMS=1,
# the suite runs as before and says so. ci/libfabric2.sh binds this
# namespace's /proc/kallsyms over its root's where FABRIC_MSG_KALLSYMS_CUT
# (the cut file's path, empty when the file is whole) is set.

if [ -z "${FABRIC_MSG_KALLSYMS_CUT+set}" ]; then
  if [ "$(id -u)" = 0 ] && [ "${FABRIC_MSG_FULL_KALLSYMS:-0}" != 1 ] &&
    unshare --mount --propagation private true 2>/dev/null; then
    FABRIC_MSG_KALLSYMS_CUT=$(mktemp /tmp/fabric-msg-kallsyms.XXXXXX)
    grep -E 'ib_register_peer_memory_client|ib_umem_dmabuf_get' /proc/kallsyms \
      >"$FABRIC_MSG_KALLSYMS_CUT" || true
    export FABRIC_MSG_KALLSYMS_CUT
    # shellcheck disable=SC2016
    exec unshare --mount --propagation private bash -c '
      if ! mount --bind "$FABRIC_MSG_KALLSYMS_CUT" /proc/kallsyms; then
        echo "ci/kallsyms.sh: /proc/kallsyms left whole (the bind mount failed): slower, same results" >&2
        rm -f "$FABRIC_MSG_KALLSYMS_CUT"
        FABRIC_MSG_KALLSYMS_CUT=
      else
        echo "ci/kallsyms.sh: in a private mount namespace, /proc/kallsyms cut to the $(wc -l <"$FABRIC_MSG_KALLSYMS_CUT") line(s) naming the two symbols libfabric looks for (FABRIC_MSG_FULL_KALLSYMS=1: the whole file)" >&2
      fi
      exec bash "$@"' bash "$PWD/ci/test.sh" "$@"
  fi
  export FABRIC_MSG_KALLSYMS_CUT=
  echo "ci/kallsyms.sh: /proc/kallsyms left whole (needs root and unshare -m, or FABRIC_MSG_FULL_KALLSYMS=1 was set): slower, same results" >&2
fi
