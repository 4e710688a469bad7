-- spec/prefix_cache_spec.lua -- the pool's automatic prefix cache against a
-- plain Lua model of it, under thousands of random operations (create,
-- attach, append, insert, fork, truncate, free, lookup): after every one the
-- pool's invariants hold (pa_pool_validate: no held page freed or evicted,
-- no unheld page lost), and its hits, misses, evictions, cached and free
-- pages, and each sequence's page sharing equal the model's. The model keys
-- pages by their key strings, not by the C hashes, so it also checks that
-- the chain hashes tell prefixes apart.
local pa = require "pagedattn"
local H = require "helpers"

local SPEC = "spec/prefix_cache_spec.lua"

---------------------------------------------------------------------------
-- the model: pages are Lua objects; only what decides hits is kept

local Model = {}
Model.__index = Model

local function new_model(num_pages, ps)
  return setmetatable({ ps = ps, free = num_pages, lru = {}, map = {}, hits = 0, misses = 0, evictions = 0,
    cached = 0 }, Model)
end

function Model:available() return self.free + #self.lru end

local function lru_remove(m, p)
  for i = 1, #m.lru do if m.lru[i] == p then table.remove(m.lru, i) return end end
  error("model: page not on the lru list")
end

function Model:pop()
  if self.free > 0 then
    self.free = self.free - 1
    return { rc = 0 }
  end
  local p = table.remove(self.lru, 1) -- the least recently released
  self.map[p.hash] = nil
  self.cached = self.cached - 1
  self.evictions = self.evictions + 1
  return { rc = 0 }
end

function Model:ref(p)
  if p.rc == 0 and p.hash then lru_remove(self, p) end
  p.rc = p.rc + 1
end

function Model:unref(p)
  p.rc = p.rc - 1
  if p.rc == 0 then
    if p.hash then self.lru[#self.lru + 1] = p else self.free = self.free + 1 end
  end
end

local function pages_for(len, ps) return math.floor((len + ps - 1) / ps) end

-- the key string of page i (0-based) of a key list: the whole prefix
local function hkey(keys, i) return table.concat(keys, ",", 1, i + 1) end

function Model:lookup(keys, n)
  local m, idle = 0, 0
  while m < n and self.map[hkey(keys, m)] do
    if self.map[hkey(keys, m)].rc == 0 then idle = idle + 1 end
    m = m + 1
  end
  return m, idle
end

function Model:attach(s, n)
  local m = self:lookup(s.keys, n)
  for i = 0, m - 1 do
    local p = self.map[hkey(s.keys, i)]
    self:ref(p)
    s.pages[i + 1] = p
  end
  s.len = m * self.ps
  self.hits, self.misses = self.hits + m, self.misses + n - m
  return m
end

-- as pa_seq_append: a shared partial last page copied first, then fresh pages
function Model:append(s, n)
  if n == 0 then return true end
  local ps = self.ps
  local fresh = math.max(0, pages_for(s.len + n, ps) - #s.pages)
  local last = s.len % ps ~= 0 and s.pages[math.floor(s.len / ps) + 1]
  local cow = last and (last.rc > 1 or last.hash ~= nil) -- a cached page is never written
  if fresh + (cow and 1 or 0) > self:available() then return false end
  if cow then
    local idx = math.floor(s.len / ps) + 1
    local copy = self:pop()
    self:ref(copy)
    local old = s.pages[idx]
    s.pages[idx] = copy
    self:unref(old)
  end
  for _ = 1, fresh do
    local p = self:pop()
    self:ref(p)
    s.pages[#s.pages + 1] = p
  end
  s.len = s.len + n
  return true
end

function Model:insert(s, first, n)
  local added = 0
  for i = first, first + n - 1 do
    local p, h = s.pages[i + 1], hkey(s.keys, i)
    if not p.hash and not self.map[h] then
      p.hash = h
      self.map[h] = p
      self.cached = self.cached + 1
      added = added + 1
    end
  end
  return added
end

function Model:shrink(s, len)
  local keep = pages_for(len, self.ps)
  for j = #s.pages, keep + 1, -1 do
    self:unref(s.pages[j])
    s.pages[j] = nil
  end
  s.len = len
end

---------------------------------------------------------------------------

local function chain(keys, n)
  local out = pa.prefix_hashes{ num_pages = n, keys = keys }
  return out
end

describe("prefix cache: hashes", function()
  it("chains: the hash of a page names its whole prefix", function()
    local a = chain({ 5, 6, 7, 8 }, 4)
    local b = chain({ 5, 6, 9, 8 }, 4)
    assert.are.equal(a[0], b[0])
    assert.are.equal(a[1], b[1])
    assert.are_not.equal(a[2], b[2])
    assert.are_not.equal(a[3], b[3]) -- same key, different prefix
    local c = chain({ 6, 5 }, 2)
    assert.are_not.equal(a[0], c[0])
    assert.are_not.equal(a[1], c[1])
    -- parent continues a chain
    local tail = pa.prefix_hashes{ num_pages = 2, keys = { 7, 8 }, parent = a[1] }
    assert.are.equal(a[2], tail[0])
    assert.are.equal(a[3], tail[1])
  end)

  it("hashes token ids page by page, position by position", function()
    local t1 = pa.prefix_hashes{ num_pages = 2, page_size = 3, tokens = { 1, 2, 3, 4, 5, 6 } }
    local t2 = pa.prefix_hashes{ num_pages = 2, page_size = 3, tokens = { 1, 2, 3, 4, 6, 5 } }
    local t3 = pa.prefix_hashes{ num_pages = 1, page_size = 3, tokens = { 1, 2, 3 } }
    assert.are.equal(t1[0], t2[0])
    assert.are.equal(t1[0], t3[0])
    assert.are_not.equal(t1[1], t2[1])
  end)

  it("names a bad argument", function()
    assert.matches("tokens: give tokens", H.error_of(pa.prefix_hashes, { num_pages = 1 }))
    assert.matches("tokens: 2 token ids for 1 pages of 3",
      H.error_of(pa.prefix_hashes, { num_pages = 1, page_size = 3, tokens = { 1, 2 } }))
    assert.matches("keys%[2%]", H.error_of(pa.prefix_hashes, { num_pages = 2, keys = { 1, -1 } }))
  end)
end)

describe("prefix cache: the pool", function()
  local function stats_match(cache, m, where)
    local s = cache:stats()
    local want = { prefix_hits = m.hits, prefix_misses = m.misses, prefix_evictions = m.evictions,
      cached_pages = m.cached, free_pages = m:available() }
    for k, v in pairs(want) do
      if s[k] ~= v then error(string.format("%s: %s is %d, the model says %d", where, k, s[k], v), 2) end
    end
  end

  it("errors name the argument and change nothing", function()
    local c = assert(pa.kv_cache{ num_pages = 8, page_size = 2, layers = 0 })
    local s = c:sequence()
    assert.matches("prefix caching is off", H.error_of(function() s:prefix_attach(1, { 1 }) end))
    c:enable_prefix_cache(true)
    assert(s:append(5))
    local h = chain({ 1, 2, 3 }, 3)
    assert.matches("n: pages %[0, 3%) of sequence %d+ are not all full",
      H.error_of(function() s:prefix_insert(0, 3, h) end))
    assert.are.equal(2, s:prefix_insert(0, 2, h))
    local before = c:stats()
    local other = chain({ 9, 9 }, 2)
    assert.matches("hashes: entry 0 differs", H.error_of(function() s:prefix_insert(0, 2, other) end))
    assert.matches("holds 3 pages; attach starts an empty sequence",
      H.error_of(function() s:prefix_attach(2, h) end))
    assert.are.same(before, c:stats())
    c:validate()
    -- cut back into a cached page: it stays cached, and the next write copies it
    s:truncate(3)
    assert.are.equal(2, c:stats().cached_pages)
    assert.are.equal(1, s:pages_needed(1))
    local page1 = s:pages()[2]
    assert(s:append(1))
    assert.are_not.equal(page1, s:pages()[2])
    local t = c:sequence()
    assert.are.equal(2, t:prefix_attach(3, h))
    assert.are.equal(4, t:len())
    assert.are.equal(page1, t:pages()[2])
    c:validate()
    s:free()
    t:free()
    -- off: the idle cached pages are free again
    assert.are.equal(2, c:stats().cached_pages)
    assert.are.equal(8, c:stats().free_pages)
    c:enable_prefix_cache(false)
    assert.are.equal(8, c:stats().free_pages)
    assert.are.equal(0, c:stats().cached_pages)
    c:validate()
    c:close()
  end)

  it("keeps a page after its last holder, reuses it, and evicts the least recently released", function()
    local c = assert(pa.kv_cache{ num_pages = 4, page_size = 1, layers = 0 })
    c:enable_prefix_cache(true)
    local h = chain({ 1, 2, 3, 4 }, 4)
    local a = c:sequence()
    assert(a:append(2))
    a:prefix_insert(0, 2, h)
    a:free()                                   -- pages 1 then 0 become idle (tail first)
    assert.are.equal(4, c:stats().free_pages)
    assert.are.equal(2, c:prefix_lookup(4, h))
    local b = c:sequence()
    assert(b:append(3))                        -- 2 free pages, then one eviction: the tail page
    assert.are.equal(1, c:stats().prefix_evictions)
    assert.are.equal(1, c:prefix_lookup(4, h)) -- the first page, shared by more, stays
    c:validate()
    c:close()
  end)

  it("takes a page out when an unstage makes it a reserved page again (written later without a copy)", function()
    local c = assert(pa.kv_cache{ num_pages = 8, page_size = 2, layers = 0 })
    c:enable_prefix_cache(true)
    local s = c:sequence()
    assert(s:reserve(4))                       -- two pages, no tokens
    local b = assert(c:batch())
    b:add(s, 4)
    assert(b:stage())                          -- fills them
    local h = chain({ 1, 2 }, 2)
    assert.are.equal(2, s:prefix_insert(0, 2, h))
    assert.are.equal(2, c:stats().cached_pages)
    assert(b:unstage())                        -- empty again, the two pages reserved
    assert.are.same({ 0, 2 }, { s:len(), s:num_pages() })
    assert.are.equal(0, c:stats().cached_pages)
    assert.are.equal(0, c:prefix_lookup(2, h))
    c:validate()
    -- a stage's fresh pages go back to the free pages, and stay cached there
    local t = c:sequence()
    b:clear():add(t, 4)
    assert(b:stage())
    assert.are.equal(2, t:prefix_insert(0, 2, h))
    assert(b:unstage())
    assert.are.same({ 0, 0 }, { t:len(), t:num_pages() })
    assert.are.equal(2, c:stats().cached_pages)
    assert.are.equal(2, c:prefix_lookup(2, h))
    c:validate()
    b:close()
    c:close()
  end)

  it("matches a Lua model under random operations", function()
    -- (more rounds, up to 16, while a kind of event has not happened yet: a
    -- scaled-down run, as under the sanitizers, may draw too few of them)
    local rounds = H.scale(4)
    local totals = { hits = 0, evictions = 0, cows = 0 }
    local round = 0
    while round < rounds or ((totals.hits == 0 or totals.evictions == 0 or totals.cows == 0) and round < 16) do
      round = round + 1
      local seed = H.seed("prefix-model", round)
      local rng = H.rng("prefix-model", round)
      local ps = ({ 1, 2, 3, 4 })[rng:int(1, 4)]
      local N = rng:int(6, 24)
      local c = assert(pa.kv_cache{ num_pages = N, page_size = ps, layers = 0 })
      c:enable_prefix_cache(true)
      local m = new_model(N, ps)
      local MAXP = 12
      -- documents: key lists that sequences start from, so prefixes repeat
      local docs = {}
      for d = 1, 3 do
        docs[d] = {}
        for i = 1, MAXP do docs[d][i] = rng:int(1, 3) end
      end
      local function new_keys(from, keys)
        keys = keys or {}
        for i = from, MAXP do keys[i] = rng:int(1, 1000) end
        return keys
      end
      local seqs = {}
      local function add_seq(cseq, keys)
        seqs[#seqs + 1] = { c = cseq, m = { pages = {}, len = 0, keys = keys } }
        return seqs[#seqs]
      end
      local function where(op, i)
        return string.format("round %d (seed %d, page size %d, %d pages), op %d (%s); %s", round, seed, ps, N, i, op,
          H.rerun(SPEC))
      end
      for i = 1, H.scale(800) do
        local r = rng:uniform()
        local op
        if r < 0.15 or #seqs == 0 then
          op = "create+attach"
          if #seqs < 10 then
            local d = docs[rng:int(1, 3)]
            local keys = {}
            local keep = rng:int(0, MAXP)
            for k = 1, keep do keys[k] = d[k] end
            new_keys(keep + 1, keys)
            local s = add_seq(assert(c:sequence()), keys)
            local n = rng:int(0, MAXP)
            local h = chain(keys, MAXP)
            local got = s.c:prefix_attach(n, h)
            local want = m:attach(s.m, n)
            assert(got == want, where(op, i) .. string.format(": attach matched %d, the model %d", got, want))
          end
        elseif r < 0.40 then
          op = "append"
          local s = seqs[rng:int(1, #seqs)]
          local n = rng:int(0, 2 * ps + 1)
          if s.m.len + n <= MAXP * ps then
            local ok = s.c:append(n) ~= nil
            local want = m:append(s.m, n)
            assert(ok == want, where(op, i) .. ": append " .. (ok and "fit" or "did not fit") .. ", the model disagrees")
          end
        elseif r < 0.60 then
          op = "insert"
          local s = seqs[rng:int(1, #seqs)]
          local full = math.floor(s.m.len / ps)
          if full > 0 then
            local first = rng:int(0, full - 1)
            local n = rng:int(0, full - first)
            local got = s.c:prefix_insert(first, n, chain(s.m.keys, MAXP))
            local want = m:insert(s.m, first, n)
            assert(got == want, where(op, i) .. string.format(": inserted %d, the model %d", got, want))
          end
        elseif r < 0.68 then
          op = "fork"
          local s = seqs[rng:int(1, #seqs)]
          if #seqs < 10 then
            local child = assert(s.c:fork())
            local keys = {}
            for k = 1, MAXP do keys[k] = s.m.keys[k] end
            new_keys(math.floor(s.m.len / ps) + 1, keys) -- the child writes its own text from here
            local t = add_seq(child, keys)
            for j = 1, pages_for(s.m.len, ps) do
              t.m.pages[j] = s.m.pages[j]
              m:ref(s.m.pages[j])
            end
            t.m.len = s.m.len
          end
        elseif r < 0.78 then
          op = "truncate"
          local s = seqs[rng:int(1, #seqs)]
          local len = rng:int(0, s.m.len)
          s.c:truncate(len)
          m:shrink(s.m, len)
          new_keys(math.floor(len / ps) + 1, s.m.keys)
        elseif r < 0.92 then
          op = "free"
          local k = rng:int(1, #seqs)
          seqs[k].c:free()
          m:shrink(seqs[k].m, 0)
          table.remove(seqs, k)
        else
          op = "lookup"
          local s = seqs[rng:int(1, #seqs)]
          local n = rng:int(0, MAXP)
          local got, idle = c:prefix_lookup(n, chain(s.m.keys, MAXP))
          local want, widle = m:lookup(s.m.keys, n)
          assert(got == want and idle == widle, where(op, i) ..
            string.format(": lookup %d (%d idle), the model %d (%d idle)", got, idle, want, widle))
        end
        local ok, err = pcall(c.validate, c)
        assert(ok, where(op, i) .. ": " .. tostring(err))
        stats_match(c, m, where(op, i))
        -- the sharing is the model's: one C page per model page, and back
        local of, back = {}, {}
        for _, s in ipairs(seqs) do
          local ids = s.c:pages()
          assert(#ids == #s.m.pages, where(op, i) .. ": a sequence holds " .. #ids .. " pages, the model " .. #s.m.pages)
          for j, id in ipairs(ids) do
            local p = s.m.pages[j]
            assert(of[p] == nil or of[p] == id, where(op, i) .. ": one model page is two pool pages")
            assert(back[id] == nil or back[id] == p, where(op, i) .. ": pool page " .. id .. " is two model pages")
            of[p], back[id] = id, p
          end
        end
      end
      for _, s in ipairs(seqs) do s.c:free() end
      c:validate()
      totals.hits, totals.evictions = totals.hits + m.hits, totals.evictions + m.evictions
      totals.cows = totals.cows + c:stats().cow_copies
      c:close()
    end
    -- the operations reached what they are here to check
    assert(totals.hits > 0 and totals.evictions > 0 and totals.cows > 0, string.format(
      "no hits, evictions or copies to check (%d, %d, %d)", totals.hits, totals.evictions, totals.cows))
  end)
end)
