-- The reply of a lock operations call (ops.lua): the values of its operations, three per
-- operation, as one string of decimal texts separated by single spaces, which the client
-- splits itself: one reply element instead of three per operation (parsing a reply element
-- costs the client more than an operation's own bookkeeping). A call whose values are not all
-- integers or text (a failed operation's message, a value Redis would turn into nil) replies
-- the values themselves, an array. scripts/mod.rs puts this after clock.lua.

-- The small values nearly every reply has, as text (no formatting).
local reply_digits = {[-2] = '-2', [-1] = '-1', [0] = '0', '1', '2', '3'}

-- `values` (a table of three values per operation) as the call's reply.
local function reply_of(values)
  local texts = {}
  for i = 1, #values do
    local v = values[i]
    if type(v) == 'number' then
      -- '%d': Lua would write a large number in exponent notation, and Redis turns a
      -- fraction into an integer by dropping it, as '%d' does
      texts[i] = reply_digits[v] or string.format('%d', v)
    elseif type(v) == 'string' then
      texts[i] = v
    else
      return values
    end
  end
  return table.concat(texts, ' ')
end
