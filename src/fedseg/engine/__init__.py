"""Engines that run methods: the in-process simulator (default) and the Flower adapter."""
