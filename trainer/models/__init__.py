"""Model families torchtune 0.6.1 has no builder for, built on its public modules."""
