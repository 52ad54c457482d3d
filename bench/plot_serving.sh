#!/usr/bin/env bash
# Plots of a serving sweep: goodput (requests/s within the SLOs) and request
# throughput against the offered rate, and the CDFs of TTFT and TPOT at each
# rate. DIR is a sweep's OUT directory (bench/serving.sh): rate<R>.json
# (loadgen --json_out) and rate<R>.csv (loadgen --requests_csv) per rate.
# Writes goodput.png, ttft_cdf.png and tpot_cdf.png (and the .dat files they
# are drawn from) into DIR, with gnuplot (Debian: gnuplot-nox). A rateinf
# sweep (every request at once) joins the CDFs, not the goodput plot.
#
#   bench/plot_serving.sh DIR [TITLE]
set -euo pipefail
dir=${1:?usage: bench/plot_serving.sh DIR [TITLE]}
title=${2:-serving sweep}
if ! command -v gnuplot >/dev/null; then
  echo "plot_serving.sh: gnuplot is not installed (apt-get install gnuplot-nox)" >&2
  exit 1
fi

# goodput.dat (rate, goodput, throughput, attainment) and, per rate,
# cdf_<R>.dat (TTFT ms, TPOT ms and their cumulative fractions).
python3 - "$dir" <<'EOF'
import csv, glob, json, os, re, sys

d = sys.argv[1]
rates = []
for path in glob.glob(os.path.join(d, "rate*.json")):
    m = re.search(r"rate([0-9.]+|inf)\.json$", path)
    if not m:
        continue
    r = json.load(open(path))
    t = r["throughput"]
    rates.append((float(m.group(1)), m.group(1), t["goodput_rps"], t["request_rps"],
                  r["slo"]["attainment"] or 0.0))
if not rates:
    sys.exit(f"plot_serving.sh: no rate*.json in {d}")
rates.sort()
with open(os.path.join(d, "goodput.dat"), "w") as f:
    f.write("# rate goodput_rps request_rps slo_attainment\n")
    for rate, _, good, tput, att in rates:
        if rate == float("inf"):
            continue
        f.write(f"{rate:g} {good:g} {tput:g} {att:g}\n")


def cdf(values):
    values = sorted(values)
    return [(v, (i + 1) / len(values)) for i, v in enumerate(values)]


with open(os.path.join(d, "rates.txt"), "w") as names:
    for _, label, *_ in rates:
        path = os.path.join(d, f"rate{label}.csv")
        if not os.path.exists(path):
            continue
        rows = [r for r in csv.DictReader(open(path)) if r["outcome"] == "completed"]
        ttft = cdf([float(r["ttft_ms"]) for r in rows if r["ttft_ms"]])
        tpot = cdf([float(r["tpot_ms"]) for r in rows if r["tpot_ms"]])
        with open(os.path.join(d, f"cdf_{label}.dat"), "w") as f:
            f.write("# ttft_ms fraction tpot_ms fraction\n")
            for i in range(max(len(ttft), len(tpot))):
                a = ttft[i] if i < len(ttft) else ("", "")
                b = tpot[i] if i < len(tpot) else ("", "")
                f.write(" ".join(str(x) if x != "" else "NaN" for x in (*a, *b)) + "\n")
        names.write(label + "\n")
EOF

rates=$(tr '\n' ' ' <"$dir/rates.txt")
cd "$dir"
gnuplot <<EOF
set terminal pngcairo size 900,560 font ",11"
set grid
set key left top

set output "goodput.png"
set title "$title: goodput and throughput against the offered rate"
set xlabel "offered rate (requests/s)"
set ylabel "requests/s"
set y2label "SLO attainment"
set y2range [0:1.05]
set y2tics
plot "goodput.dat" using 1:1 with lines dashtype 2 lc rgb "gray" title "offered", \
     "goodput.dat" using 1:3 with linespoints lw 2 title "completed", \
     "goodput.dat" using 1:2 with linespoints lw 2 title "goodput (within SLOs)", \
     "goodput.dat" using 1:4 axes x1y2 with linespoints dashtype 3 title "SLO attainment"
unset y2label
unset y2tics

set key right bottom
set ylabel "fraction of requests"
set yrange [0:1]
set logscale x
set output "ttft_cdf.png"
set title "$title: TTFT"
set xlabel "TTFT (ms)"
plot for [r in "$rates"] "cdf_".r.".dat" using 1:2 with lines lw 2 title r." req/s"
set output "tpot_cdf.png"
set title "$title: TPOT"
set xlabel "TPOT (ms)"
plot for [r in "$rates"] "cdf_".r.".dat" using 3:4 with lines lw 2 title r." req/s"
EOF
echo "wrote $dir/goodput.png, $dir/ttft_cdf.png, $dir/tpot_cdf.png"
