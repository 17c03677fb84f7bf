"""An opt-in reduced-precision wire format: --wire_dtype=bfloat16 (or float16).

A worker reads each dense float32 variable through a cast to the wire type made on the variable's
own device, so half the bytes cross the network, and casts it back to float32 for its math. With
gradients colocated with their forward ops, the gradient of that cast (wire type back to float32)
runs on the ps too: gradients also cross in the wire type. The ps keeps and updates float32 master
copies; checkpoints and exports are float32. Embedding tables (what the model made in
model/needs.table_part, whole or partitioned) are left alone: their lookups move only the rows a step
touches.
"""

import tensorflow as tf

from ps_trainer.model import needs

v1 = tf.compat.v1
WIRE_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16, "float16": tf.float16}


def read_through(wire_dtype):
    """A variable_scope custom_getter reading float32 variables through wire_dtype; None for float32."""
    if wire_dtype == tf.float32:
        return None

    def read(getter, *args, **kwargs):  # TensorFlow passes the next getter as `getter`
        variable = getter(*args, **kwargs)
        if (kwargs.get("partitioner") is not None or variable.dtype.base_dtype != tf.float32
                or needs.is_table(variable)):
            return variable
        with v1.device(variable.device):
            on_the_wire = tf.cast(variable, wire_dtype, name="to_wire")
        return tf.cast(on_the_wire, tf.float32, name="from_wire")

    return read
