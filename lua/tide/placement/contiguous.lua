-- The default placement (tide.mpi): contiguous blocks of experts, the same
-- in every MoE block. Expert e of E goes to rank floor(e * N / E): with 256
-- experts on 4 ranks, 0-63 on rank 0, 64-127 on rank 1, and so on.
-- A placement is a function(info) -> owner; docs/scale-out.md has the
-- contract (info.ranks, info.experts, info.blocks, info.n_blocks, info.config;
-- owner[e], or owner[b][e] per block).
return function(info)
  local owner = {}
  for e = 0, info.experts - 1 do owner[e] = math.floor(e * info.ranks / info.experts) end
  return owner
end
