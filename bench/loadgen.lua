-- wrk script: POST JSON chat requests taken in turn from a file (one body per line),
-- then print one machine-readable line with the exact latency percentiles in µs.
-- Usage: wrk ... -s loadgen.lua URL -- BODIES_FILE
local requests = {}
local turn = 0

function init(args)
  local headers = { ["Content-Type"] = "application/json" }
  for line in io.lines(args[1]) do
    if #line > 0 then
      requests[#requests + 1] = wrk.format("POST", nil, headers, line)
    end
  end
  assert(#requests > 0, "no request bodies in " .. args[1])
end

function request()
  turn = turn % #requests + 1
  return requests[turn]
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"timeouts":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
