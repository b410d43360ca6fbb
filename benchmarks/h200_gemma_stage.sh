# Sourced by the Gemma-3-270M scripts for an H200 machine without network access (h200_gemma_quality.sh,
# h200_gemma_stability.sh), from the repository root: installs the gguf-0.19.0 and transformers-5.23.0
# wheels kept in ../.whl into /tmp/site (transformers 5.17 converts Gemma-3's GGUF tokenizer into
# two-character pieces, reports/diagnostics/gemma3-h200-mismatch, which sfibench refuses at load), puts
# them and the checkout on PYTHONPATH, and assembles the GGUF from its parts under /root/g (g.00, g.01,
# ...: `split -n 6 -d -a 2 GGUF g.`, since one device call carries at most 64 MiB) and checks its hash.
# Sets $model to the file; exits the calling script when any step fails.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
python -c "import transformers; print('transformers', transformers.__version__)"
model=/root/g/gemma-3-270m-q4_k_m.gguf
cat /root/g/g.[0-9][0-9] > "$model" || exit 1  # the glob sorts: g.00, g.01, ...
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $model" | sha256sum -c || exit 1
