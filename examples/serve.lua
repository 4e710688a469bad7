-- examples/serve.lua: a continuous-batching LLM serving experiment on a paged
-- KV cache: the command line of the pagedattn.serve library.
--
--   scripts/run examples/serve.lua                      small, checked against the reference
--   scripts/run examples/serve.lua --size medium --policy sjf
--   scripts/run examples/serve.lua --trace examples/traces/mooncake.jsonl --prefix-cache \
--       --requests-out requests.csv --summary-out summary.json
--   scripts/run examples/serve.lua --help
--
-- A trace (a public format, or the synthetic generator) feeds an engine that,
-- every step, asks the policy which requests run and with how many tokens,
-- stages them as one batch and runs real attention on the device; time is in
-- seconds of a model clock (measured attention x layers + a cost model of
-- the rest of the model) or a fixed step. README.md ("The serving
-- experiment") explains the flags, the outputs and the policy API.
local cli = require "pagedattn.serve.cli"
os.exit(cli.main(arg))
