# session 89: export/conv.py (C: LFM2's conv layers' inputs exposed as outputs, for the runtime's rollback) and
# export/greedy.py (A: the cuda layout's per-position argmax output). Written here, not by a helper.
# Likely tests: test_conv.py (LFM2 exports, rollback exactness, expose_conv_inputs' refusals), test_layout.py
# (tiny_cuda_bundle's argmax output, test_cuda_target_argmax_output, test_argmax_output_refuses_...).
C = "export/conv.py"
A = "export/greedy.py"
MUTANTS = [
# C1 the layer number read from a state name that only contains the pattern (search for fullmatch)
("C1", C, "(m := pattern.fullmatch(i.name))", "(m := pattern.search(i.name))"),
# C2 a node reading no graph state input taken (its state input unchecked)
("C2", C, "        if len(n.input) < 4 or n.input[3] not in layer_of:\n", "        if len(n.input) < 4:\n"),
# C3 a state-window node taken (the option edgespec does not use)
("C3", C, '            if a.name == "state_window" and helper.get_attribute_value(a):', '            if False:'),
# C4 a state shape without static channels taken
("C4", C, "        if len(dims) != 3 or not dims[1] or not dims[2]:", "        if len(dims) != 3:"),
# C5 the conv input exposed is the node's state input, not its input
("C5", C, 'helper.make_node("Identity", [n.input[0]], [name]', 'helper.make_node("Identity", [n.input[3]], [name]'),
# C6 the output's channel dim the state's length
("C6", C, '["batch_size", dims[1], "sequence_length"]', '["batch_size", dims[2], "sequence_length"]'),
# C7 the record's channels and length swapped
("C7", C, "        out.append((layer, int(dims[1]), int(dims[2])))", "        out.append((layer, int(dims[2]), int(dims[1])))"),
# C8 fewer conv nodes than state inputs taken
("C8", C, "    if len(out) != len(layer_of):", "    if len(out) > len(layer_of):"),
# C9 the layers not sorted (the graph's node order)
("C9", C, "    return tuple(sorted(out))", "    return tuple(out)"),
# C10 the output added even where the graph has it (a second output of one name)
("C10", C, "        if name not in have:\n", "        if True:\n"),
# A1 an output name that exists taken (two outputs named argmax)
("A1", A, "    if name in outs:\n        raise", "    if False:\n        raise"),
# A2 the slice's end not the rows (every position)
("A2", A, 'consts = {"starts": 0, "ends": rows, "axes": 1}', 'consts = {"starts": 0, "ends": 2 ** 62, "axes": 1}'),
# A3 the slice over the vocabulary axis
("A3", A, 'consts = {"starts": 0, "ends": rows, "axes": 1}', 'consts = {"starts": 0, "ends": rows, "axes": 2}'),
# A4 float16 logits reduced without the Cast (ties broken in float16)
("A4", A, "    if src.type.tensor_type.elem_type != TensorProto.FLOAT:", "    if False:"),
# A5 the argmax keeps its reduced axis ([batch, rows, 1])
("A5", A, "axis=-1, keepdims=0,", "axis=-1, keepdims=1,"),
# A6 the argmax over the positions, not the vocabulary
("A6", A, "axis=-1, keepdims=0,", "axis=1, keepdims=0,"),
# A7 the output declared float (the runtime binds int64)
("A7", A, "helper.make_tensor_value_info(name, TensorProto.INT64, shape)", "helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)"),
# A8 the batch dim not taken from the logits (None)
("A8", A, "    batch = (dims[0].dim_param or dims[0].dim_value or None) if len(dims) == 3 else None", "    batch = None"),
# A9 a graph without the logits output: KeyError, not the one-line refusal
("A9", A, "    if logits not in outs:\n        raise", "    if False:\n        raise"),
]
