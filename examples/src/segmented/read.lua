-- Reads a segment's stock for a hold of its lock and records the hold's fencing token: from
-- then on a write by any older hold is refused (see write.lua), so a holder that outlived its
-- lease cannot write back a stock a newer holder has already read.
--
-- KEYS[1]  the segment's stock counter
-- KEYS[2]  the token of the last hold that read it
-- ARGV[1]  this hold's fencing token (decimal, no leading zeros)
--
-- Reply: {1, stock} read (and the token recorded) | {0, 0} refused: a newer hold has read the
-- segment | {-1, 0} the segment was never stocked

-- Tokens are compared as decimal strings (exact for every u64; Lua numbers are not).
local function older(a, b)
    return #a < #b or (#a == #b and a < b)
end

local last = redis.call('GET', KEYS[2])
if last and older(ARGV[1], last) then
    return {0, 0}
end
redis.call('SET', KEYS[2], ARGV[1])
local stock = redis.call('GET', KEYS[1])
if not stock then
    return {-1, 0}
end
return {1, tonumber(stock)}
