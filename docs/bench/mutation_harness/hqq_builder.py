# session 87: export/hqq_builder.py (Q), the builder's node quantizer for --quant-algo hqq and q4_k
# Q1: a chunked weight's chunks cut one row short (rows dropped between chunks)
# Q2: only the first chunk's arrays returned
# Q3: q4_k's refusal of blocks other than 32 removed
# Q4: q4_k's scales and zero points returned swapped
# Q5: q4_k's blocks from min-max rounding, not llama.cpp's Q4_K fit
# Q6: the refusal of --quantize-embeddings with hqq/q4_k removed
# Q7: HQQ's block size fixed at 128, not the builder's
# Q8: HQQ's bits fixed at 4, not the builder's
# Q9: the builder's accuracy_level never stamped on the nodes
# Q10: accuracy_level stamped even where a node has one (a second attribute)
# Q11: the default node quantizer q4_k, not hqq
# Q12: a forked builder's already-imported builders.base left with onnxruntime's own quantizer
Q = "export/hqq_builder.py"
MUTANTS = [
("Q1", Q, "(tensor[i:i + rows], bits", "(tensor[i:i + rows - 1], bits"),
("Q2", Q, "        return tuple(torch.cat([p[j] for p in parts]) for j in range(3))",
          "        return tuple(parts[0][j] for j in range(3))"),
("Q3", Q, "if bits != 4 or group_size != 32 or axis != 1 or K % 32:", "if bits != 4 or axis != 1 or K % 32:"),
("Q4", Q, "        return (torch.from_numpy(q.astype(np.int32)), torch.from_numpy(scale).to(tensor.dtype),\n"
          "                torch.from_numpy(zero).to(tensor.dtype))",
          "        return (torch.from_numpy(q.astype(np.int32)), torch.from_numpy(zero).to(tensor.dtype),\n"
          "                torch.from_numpy(scale).to(tensor.dtype))"),
("Q5", Q, "q, scale, zero = float_zero_points(four_bit_blocks(w))",
          "from .gguf_blocks import min_max_4bit\n        q, scale, zero = float_zero_points(min_max_4bit(w))"),
("Q6", Q, 'if tuple(op_types_to_quantize or ("MatMul",)) != ("MatMul",):', "if False:"),
("Q7", Q, "mnq.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits,",
          "mnq.HQQWeightOnlyQuantConfig(block_size=128, bits=bits,"),
("Q8", Q, "mnq.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits,",
          "mnq.HQQWeightOnlyQuantConfig(block_size=block_size, bits=4,"),
("Q9", Q, "        if not self._accuracy_level:  # (None or 0", "        if True:  # (None or 0"),
("Q10", Q, 'if n.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in n.attribute):',
           'if n.op_type == "MatMulNBits":'),
("Q11", Q, 'os.environ.get("EDGESPEC_QUANT_ALGO", "hqq")', 'os.environ.get("EDGESPEC_QUANT_ALGO", "q4_k")'),
("Q12", Q, "        base.MatMulNBitsQuantizer = HQQMatMulNBitsQuantizer", "        pass"),
]
