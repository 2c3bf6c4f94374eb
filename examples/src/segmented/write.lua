-- Writes a segment's stock for the hold that read it last (read.lua): refused when a newer
-- hold has read the segment since.
--
-- KEYS[1]  the segment's stock counter
-- KEYS[2]  the token of the last hold that read it
-- ARGV[1]  this hold's fencing token, as given to read.lua
-- ARGV[2]  the new stock
--
-- Reply: 1 written | 0 refused

if redis.call('GET', KEYS[2]) ~= ARGV[1] then
    return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
