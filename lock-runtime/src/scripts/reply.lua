-- The reply of a lock operations call (ops.lua): the values of its operations, three per
-- operation, as one string of decimal texts separated by single spaces, which the client
-- splits itself: one reply element instead of three per operation (parsing a reply element
-- costs the client more than an operation's own bookkeeping). A call with a failed operation,
-- or with a value that is not an integer or text (one Redis would turn into nil), replies the
-- values themselves, an array (in which the client reads a decimal text as its integer).
-- scripts/mod.rs puts this after clock.lua.

-- The small values nearly every reply has, as text (no formatting).
local reply_digits = {[-2] = '-2', [-1] = '-1', [0] = '0', '1', '2', '3'}

-- A reply value as decimal text: a number through '%d' (Lua writes a large number in exponent
-- notation, and Redis turns a fraction into an integer by dropping it, as '%d' does; Lua's own
-- conversion of a number in a concatenation is a `sprintf` of '%.14g', which costs a call more
-- than its operation), text as it is; nil for anything else.
local function reply_text(v)
  local digits = reply_digits[v]
  if digits then
    return digits
  end
  local kind = type(v)
  if kind == 'number' then
    return sformat('%d', v)
  elseif kind == 'string' then
    return v
  end
  return nil
end

-- The reply of a call of one operation whose values are `code, x, y`.
local function reply_of(code, x, y)
  local c, tx, ty = reply_text(code), reply_text(x), reply_text(y)
  if c and tx and ty then
    return c .. ' ' .. tx .. ' ' .. ty
  end
  return {code, x, y}
end
