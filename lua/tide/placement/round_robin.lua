-- Round-robin placement (tide.mpi): expert e on rank e mod N, the same in
-- every MoE block. Spreads neighbouring experts over the ranks.
return function(info)
  local owner = {}
  for e = 0, info.experts - 1 do owner[e] = e % info.ranks end
  return owner
end
