#!/bin/bash
# Debian's pingpongs as two processes on localhost: default flags, -e
# (completion channels), -c (data validated), and rc with -N (ibv_wr_*).
. "$(dirname "$0")/lib.sh"
port=$((18600 + RANDOM % 200))
for t in rc uc ud srq; do
	for flags in "" "-e" "-c" "-e -c"; do
		# shellcheck disable=SC2086
		pair $((port++)) "ibv_${t}_pingpong $flags" "ibv_${t}_pingpong" -n 300 $flags &&
			expect "ibv_${t}_pingpong $flags: 300 iterations" "$TMP/cli.log" "300 iters in"
	done
done
pair $((port++)) "ibv_rc_pingpong -N" ibv_rc_pingpong -n 300 -N
pair $((port++)) "ibv_rc_pingpong -N -e -c" ibv_rc_pingpong -n 300 -N -e -c
# RoCE: a GID is needed; -g picks the GID index (1 = ::ffff:127.0.0.1).
SOFTVERBS_LINK_LAYER=roce pair $((port++)) "ibv_rc_pingpong (RoCE, -g 1)" ibv_rc_pingpong -n 300 -g 1
SOFTVERBS_LINK_LAYER=roce pair $((port++)) "ibv_ud_pingpong (RoCE, -g 1)" ibv_ud_pingpong -n 300 -g 1
finish
