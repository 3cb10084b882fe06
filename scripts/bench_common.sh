# What the side-by-side benchmark scripts share (sourced by bench_forward.sh, bench_quant_cpu.sh,
# bench_cpu.sh and bench_serve_cpu.sh).

# forward_bench's "prefill: N tokens in X s = Y tokens/s" / "decode:  batch 1, Z ms/step = W tokens/s"
# lines on stdin → Y or W, for the line that starts with $1.
rate() { sed -n "s/^$1:.* = \([0-9.]*\) tokens\/s.*/\1/p" | head -1; }
# bench_llama_cpp.mjs's line of llama.cpp's own timer on stdin ("... prefill 2135.92 ms (239.7
# tokens/s), decode 37.98 ms (26.3 tokens/s) per step") → its decode or prefill tokens/s.
inner_decode() { sed -n 's/.*decode [0-9.]* ms (\([0-9.]*\) tokens\/s) per step.*/\1/p' | head -1; }
inner_prefill() { sed -n 's/.*prefill [0-9.]* ms (\([0-9.]*\) tokens\/s).*/\1/p' | head -1; }
# $1 / $2 to two decimals, "-" when either is missing or $2 is 0.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
# The larger of $1 and $2 (either may be missing).
best() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == "" || a + 0 >= b + 0) print a; else print b }'; }
# This machine's CPU model, as lscpu names it.
cpu_model() { lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1; }
