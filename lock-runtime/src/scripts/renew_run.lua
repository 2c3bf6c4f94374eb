local renewed = {}
for i, lock in ipairs(KEYS) do
  local ok, flag = pcall(renew, lock, ARGV[2 * i + 1], ARGV[2 * i + 2])
  renewed[i] = ok and flag or -1
end
return renewed
