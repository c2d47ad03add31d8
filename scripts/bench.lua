-- The requests of scripts/bench for wrk (its Lua interface): one request
-- per call, to one of many channels, so that every server is driven by
-- the same client in the same way. Read from the environment:
--
--   BENCH_METHOD    POST (default) or GET
--   BENCH_PATH      the request path; "{c}" stands for a channel number
--                   from 0 to BENCH_CHANNELS - 1, "{after}" for a number
--                   from 0 to BENCH_AFTER
--   BENCH_CHANNELS  how many channels "{c}" ranges over (default 64)
--   BENCH_PICK      "rotate" (default): each thread takes the channels in
--                   turn, from a start of its own; "random": a channel
--                   drawn at random for every request
--   BENCH_AFTER     the highest "{after}" (default 0)
--   BENCH_BODY      the body of a POST
--   BENCH_TYPE      its Content-Type (default application/json)

local threads = 0

function setup(thread)
   thread:set("thread_number", threads)
   threads = threads + 1
end

local method, path, channels, pick, after_max, body, headers
local next_channel = 0

function init(args)
   method = os.getenv("BENCH_METHOD") or "POST"
   path = os.getenv("BENCH_PATH") or "/"
   channels = tonumber(os.getenv("BENCH_CHANNELS") or "64")
   pick = os.getenv("BENCH_PICK") or "rotate"
   after_max = tonumber(os.getenv("BENCH_AFTER") or "0")
   body = os.getenv("BENCH_BODY")
   headers = {}
   if method == "POST" then
      headers["Content-Type"] = os.getenv("BENCH_TYPE") or "application/json"
   end
   local number = thread_number or 0
   math.randomseed(os.time() * 1000 + number)
   -- Threads start apart, so that they do not hit the same channel at once.
   next_channel = math.floor(number * channels / 2) % channels
end

function request()
   local c
   if pick == "random" then
      c = math.random(0, channels - 1)
   else
      c = next_channel
      next_channel = (next_channel + 1) % channels
   end
   local p = (path:gsub("{c}", tostring(c)))
   if after_max > 0 then
      p = (p:gsub("{after}", tostring(math.random(0, after_max))))
   else
      p = (p:gsub("{after}", "0"))
   end
   return wrk.format(method, p, headers, body)
end
