-- wrk script: POST prepared remote-write bodies (snappy protobuf) in rotation.
-- args: <bodies file> <path> <content-type> [offset nthreads]
-- The bodies file holds records "<10-digit length><body>". Derived from bench/ingest/post_bodies.lua
-- (same framing and WRKJSON summary) with the remote-write headers; no placeholder: a
-- remote-write body is compressed, and its content (series and timestamps) makes it distinct.
local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
  table.insert(threads, thread)
end

function init(args)
  path = args[2]
  headers = {["Content-Type"] = args[3], ["Content-Encoding"] = "snappy",
             ["X-Prometheus-Remote-Write-Version"] = "0.1.0"}
  -- Bodies are dealt out, not replayed: thread t of nthreads posts bodies offset + t,
  -- offset + t + nthreads, ... (1-based, wrapping around), so no two requests of a run carry
  -- the same body and a later run given offset = the previous run's "last" continues where it
  -- stopped (a repeat is a cheap duplicate for gpufleet, not a measurement). Each thread reads
  -- the file record by record and keeps only its own share (LuaJIT's heap is limited).
  offset = tonumber(args[4] or "0")
  nthreads = tonumber(args[5] or "1")
  local f = assert(io.open(args[1], "rb"))
  n = 0  -- first pass: count the records (lengths only)
  while true do
    local head = f:read(10)
    if not head or #head < 10 then break end
    f:seek("cur", tonumber(head))
    n = n + 1
  end
  local j = (offset + tid - 1) % n  -- this thread's first body, 0-based
  local kept, k = {}, 0
  f:seek("set", 0)
  while k < n do
    local len = tonumber(f:read(10))
    if k % nthreads == j % nthreads then
      kept[k] = wrk.format("POST", path, headers, f:read(len))
    else
      f:seek("cur", len)
    end
    k = k + 1
  end
  f:close()
  -- in dealing order from there; past the end it wraps around to this thread's earlier ones
  -- (a run that wraps repeats bodies, and the bench warns)
  mine = {}
  for b = j, n - 1, nthreads do table.insert(mine, kept[b]) end
  for b = j % nthreads, j - 1, nthreads do table.insert(mine, kept[b]) end
  i = 0
  st = {}
end

function request()
  i = i + 1
  return mine[((i - 1) % #mine) + 1]
end

function response(status, hdrs, body)
  st[status] = (st[status] or 0) + 1
end

function done(summary, latency, requests)
  local codes = {}
  local last = 0  -- the highest body number any thread posted (before wrapping around)
  for _, t in ipairs(threads) do
    local ti, tt = t:get("i"), t:get("tid")
    if ti and ti > 0 then last = math.max(last, t:get("offset") + (ti - 1) * t:get("nthreads") + tt) end
    local s = t:get("st")
    if s then
      for code, c in pairs(s) do codes[code] = (codes[code] or 0) + c end
    end
  end
  local parts = {}
  for code, c in pairs(codes) do table.insert(parts, string.format('"%d": %d', code, c)) end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "errors_connect": %d, ' ..
    '"errors_read": %d, "errors_write": %d, "errors_timeout": %d, "last": %d, "bodies": %d, "status": {%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    last, threads[1]:get("n") or 0, table.concat(parts, ", ")))
end
