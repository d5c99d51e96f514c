"""A Flower app of its own (model, data, training) that adopts fairclip's clipping in two lines."""
