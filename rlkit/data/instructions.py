"""Instruction texts appended to questions, as the field's preprocessing scripts do."""

#: verl's GSM8K preprocessing suffix; the ``gsm8k`` reward reads the number after ``####``.
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

#: The usual MATH / AIME suffix (Qwen2.5-Math, DeepSeek-R1 evaluations); ``math`` reads the box.
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
