"""The generated messages and stubs of `berth.v1`, made from the protos when the package is built."""
